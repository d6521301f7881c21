"""Two processes on one command (``torchrun --nproc_per_node 2 -m harness run``, gloo on this CPU): the training is
split across them, generation and scoring shard the prompts, and the result is the same runs, with the same hashes,
texts and metrics, as one process gives."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.smoke


def settings(base, corpus) -> list[str]:
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


def test_two_processes_give_the_runs_of_one(tmp_path, random_llamas, harness):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"text": f"Sentence {i} of the corpus, with some words in it."}) + "\n"
                              for i in range(40)))  # fmt: skip
    args = ["run", "--method", "gu-kgw", "--attack", "slerp", "--attack-arg", "t=0.5",
            *settings(random_llamas[1], corpus)]  # fmt: skip
    one = harness(*args, "--results", str(tmp_path / "one"), timeout=600)
    assert one.returncode == 0, one.stderr[-3000:]

    torchrun = Path(sys.executable).parent / "torchrun"
    command = [str(torchrun) if torchrun.exists() else shutil.which("torchrun"), "--nproc_per_node", "2",
               "--standalone", "-m", "harness", *args, "--results", str(tmp_path / "two")]  # fmt: skip
    two = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert two.returncode == 0, two.stderr[-3000:]

    assert "generate (base model): 4/4 texts" in two.stderr  # the main process sampled its 4 of the 9 prompts
    # One report, from the main process; the same table.
    table = lambda out: out[out.index("model") :]  # noqa: E731
    assert two.stdout.count("Unwatermarked base") == 1
    assert table(two.stdout) == table(one.stdout).replace("/one/", "/two/")
    a, b = finished(tmp_path / "one"), finished(tmp_path / "two")
    assert sorted(a) == sorted(b)  # the same stages, under the same hashes
    runs = [k for k in a if "/" not in k]
    assert len(runs) == 3
    for key in a:
        assert a[key] == b[key], key  # texts, scores and metrics, byte for byte
    gens = [json.loads(line) for line in (tmp_path / "two" / runs[0] / "generations.jsonl").read_text().splitlines()]
    assert [g["i"] for g in gens] == list(range(9))
