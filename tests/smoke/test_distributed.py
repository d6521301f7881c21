"""Two processes on one command (``torchrun --nproc_per_node 2 -m harness run``, gloo on this CPU): the training is
split across them, generation and scoring shard the prompts, and the result is the same runs, with the same hashes,
texts and metrics, as one process gives (Gu-KGW's distillation and the fine-tuning attack, and PRO's co-trained
policy with FPL)."""

import json
import re
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.smoke


def settings(base, folder: Path) -> list[str]:
    """``--set`` arguments for a few-second run on ``base``, with a 40-sentence corpus written into ``folder``."""
    corpus = folder / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"text": f"Sentence {i} of the corpus, with some words in it."}) + "\n"
                              for i in range(40)))  # fmt: skip
    values = {
        "base_model": base,
        "oracle_model": base,
        "train_data.path": corpus,
        "eval_data.path": corpus,
        "train.steps": 4,
        "train.batch_size": 4,
        "train.seq_len": 16,
        "eval.num_prompts": 9,
        "eval.prompt_tokens": 4,
        "eval.new_tokens": 12,
        "eval.batch_size": 4,
        "eval.ppl_batch_size": 2,
    }  # fmt: skip  (9 prompts: the two processes get 5 and 4)
    return [arg for k, v in values.items() for arg in ("--set", f"{k}={v}")]


def finished(root: Path) -> dict[str, dict[str, bytes]]:
    """stage folder (relative) -> its result files, for every finished stage of a store."""
    out = {}
    for done in root.rglob("DONE"):
        folder = done.parent
        out[str(folder.relative_to(root))] = {
            p.name: p.read_bytes()
            for p in folder.iterdir()
            if p.name in ("metrics.json", "scores.jsonl", "generations.jsonl", "spec.json")
        }
    return out


@pytest.mark.parametrize(
    "method, attack, runs",
    [
        # Fine-tuning: the attack that all processes train together (two checkpoints: two rows). Marked slow (25 s)
        # to keep the default suite under 15 minutes: training split across processes is in PRO's case below.
        pytest.param(
            ["gu-kgw"],
            ["finetune", "--attack-arg", "steps=2,4", "--attack-arg", "batch_size=4", "--attack-arg", "seq_len=128"],
            4,
            marks=pytest.mark.slow,
        ),
        # PRO: its policy, norm loss and FPL pool across processes; SLERP: an attack the main process builds alone.
        (["pro", "--method-arg", "anti_every=2"], ["slerp", "--attack-arg", "t=0.5"], 3),
        # Gloaguen-KGW: a stage of its own (fine-tuning the stage-1 student) trained by all processes inside the
        # training stage, then a distillation with gradient masks. Marked slow (20 s) to keep the default suite under
        # 15 minutes: masks cut to each process's shard are also in test_fsdp.py's default run.
        pytest.param(["gloaguen-kgw", "--method-arg", "ft_steps=2"], ["none"], 2, marks=pytest.mark.slow),
    ],
    ids=["gu-kgw-finetune", "pro-slerp", "gloaguen"],
)
def test_two_processes_give_the_runs_of_one(tmp_path, random_llamas, cli, script, method, attack, runs):
    args = ["run", "--method", *method, "--attack", *attack, *settings(random_llamas[1], tmp_path)]
    one = cli(*args, "--results", str(tmp_path / "one"))  # in this process: one start-up less
    assert one.returncode == 0, one.stderr[-3000:]

    command = [script("torchrun"), "--nproc_per_node", "2", "--standalone", "-m", "harness", *args,
               "--results", str(tmp_path / "two")]  # fmt: skip
    two = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert two.returncode == 0, two.stderr[-3000:]

    assert "generate (base model): 4/4 texts" in two.stderr  # the main process sampled its 4 of the 9 prompts
    # One report, from the main process; the same table, but for its rounded numbers: those are the runs' metrics,
    # compared below to their tolerance (a PPL of prompts batched otherwise in each process, or a score of PRO's
    # policy, differing in the last float32 bits can move a rounded digit, or a near tie flip an AUC).
    table = lambda out: re.sub(r"\d+\.\d+", "#", out[out.index("model") :])  # noqa: E731
    assert two.stdout.count("Unwatermarked base") == 1
    assert table(two.stdout) == table(one.stdout).replace("/one/", "/two/")
    a, b = finished(tmp_path / "one"), finished(tmp_path / "two")
    assert sorted(a) == sorted(b)  # the same stages, under the same hashes
    finished_runs = [k for k in a if "/" not in k]
    assert len(finished_runs) == runs
    for key in a:
        # Texts byte for byte. A learned detector's (PRO's policy) weights may differ in the last bits, as the
        # processes' gradients are summed in another order: its scores (means of tanh outputs, |score| <= 1, texts
        # apart by ~1e-3) are compared to 1e-6 absolute, 16x the differences seen, and its metrics, which a near tie
        # that flips can move, to one text's worth. Where the scores are the same bytes, so are the metrics.
        scored = ("scores.jsonl", "metrics.json")
        assert {k: v for k, v in a[key].items() if k not in scored} == {
            k: v for k, v in b[key].items() if k not in scored
        }, key
        if "scores.jsonl" not in a[key]:
            continue
        rows = [[json.loads(line) for line in x[key]["scores.jsonl"].splitlines()] for x in (a, b)]
        for r1, r2 in zip(*rows, strict=True):
            # (prefix scores are stored rounded to 4 decimals: a last-bit difference can move one by that quantum)
            tolerance = {k: 1.5e-4 if k == "prefix_scores" else 1e-6 for k in r1}
            assert r1.keys() == r2.keys() and all(
                r1[k] == pytest.approx(r2[k], rel=1e-5, abs=tolerance[k]) for k in r1
            ), key
        m1, m2 = (json.loads(x[key]["metrics.json"]) for x in (a, b))
        if a[key]["scores.jsonl"] == b[key]["scores.jsonl"]:
            assert m1 == m2, key
        else:
            # Tokens to detect is a median of first lengths, which one flipped tie can move by several tokens.
            n1, n2 = numbers(m1), numbers(m2)
            ttd = [{k for k in n if k.startswith("tokens_to_detect")} for n in (n1, n2)]  # (None: not a number)
            assert ttd[0] == ttd[1], key
            for k in ttd[0]:
                del n1[k], n2[k]
            assert n1 == pytest.approx(n2, abs=1 / m1["n_pos"]), key
    generations = (tmp_path / "two" / finished_runs[0] / "generations.jsonl").read_text()
    gens = [json.loads(line) for line in generations.splitlines()]
    assert [g["i"] for g in gens] == list(range(9))


@pytest.mark.gpu
@pytest.mark.parametrize(
    "method",
    [["gu-kgw"], ["pro", "--method-arg", "anti_every=2"], ["gloaguen-kgw", "--method-arg", "ft_steps=2"]],
    ids=["gu-kgw", "pro", "gloaguen"],  # Gloaguen: its masks cut to each process's shard
)
def test_fsdp_launch_stores_the_runs_of_one_process(tmp_path, random_llamas, harness, script, method):
    """``accelerate launch --use_fsdp --fsdp_version 2`` over every visible GPU: the same stages under the same
    hashes as one process, and the gathered student matches one process's (tests/smoke/test_fsdp.py checks the
    sharding itself on a CPU, where accelerate does not engage FSDP)."""
    import torch
    from safetensors.torch import load_file

    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    args = ["run", "--method", *method, *settings(random_llamas[1], tmp_path)]
    one = harness(*args, "--results", str(tmp_path / "one"), timeout=900)
    assert one.returncode == 0, one.stderr[-3000:]
    gpus = torch.cuda.device_count()
    command = [script("accelerate"), "launch", "--use_fsdp", "--fsdp_version", "2", "--num_processes", str(gpus),
               *(["--multi_gpu"] if gpus > 1 else []), "-m", "harness", *args,
               "--results", str(tmp_path / "fsdp")]  # fmt: skip
    sharded = subprocess.run(command, capture_output=True, text=True, timeout=900)
    assert sharded.returncode == 0, sharded.stderr[-3000:]

    a, b = finished(tmp_path / "one"), finished(tmp_path / "fsdp")
    assert sorted(a) == sorted(b)  # the same stages, under the same hashes
    trained = [k for k in a if k.startswith("stages/train/")]
    assert trained
    for key in trained:
        one_w, fsdp_w = (load_file(tmp_path / root / key / "model" / "model.safetensors") for root in ("one", "fsdp"))
        assert one_w.keys() == fsdp_w.keys()
        for name in one_w:
            torch.testing.assert_close(fsdp_w[name], one_w[name], rtol=1e-3, atol=1e-4, msg=name)


def numbers(metrics: dict, prefix: str = "") -> dict:
    """Every number of a metrics file, flattened: ``{"auc": ..., "auc_ci95.0": ..., "paraphrase.texts": ...}``."""
    out = {}
    for key, value in metrics.items():
        if isinstance(value, dict):
            out |= numbers(value, f"{prefix}{key}.")
        elif isinstance(value, list):
            out |= numbers({str(i): v for i, v in enumerate(value)}, f"{prefix}{key}.")
        elif isinstance(value, int | float) and not isinstance(value, bool):
            out[f"{prefix}{key}"] = value
    return out
