"""Distillation of a model into another from N of its texts (attacks/distillation.py): one student per N, trained on
the first N teacher texts of one draw, the loss on the sampled tokens; bad settings and a student of another tokenizer
are one line before any work."""

from __future__ import annotations

import csv
import json

import pytest

from harness.config.errors import HarnessError
from harness.config.registry import attacks
from harness.contract.attack import AttackContext

DOCS = [
    "The quick brown fox jumps over the lazy dog and runs into the forest to find more food for the winter.",
    "A watermark is a hidden signal in generated text that a detector can find with a secret key and a test.",
    "Return the number of items in the list, or raise an error if it is empty; lists keep the order of items.",
]


@pytest.mark.parametrize(
    ("settings", "says"),
    [
        ({"texts": "0"}, "at least one teacher text"),
        ({"texts": "-5"}, "at least one teacher text"),
        ({"texts": "100,0"}, "at least one teacher text"),
        ({"texts": "ten"}, "whole numbers"),
        ({"texts": "2000000"}, "at most"),
        ({"dataset": "tiny-code-instruct"}, "instruction pairs"),
        ({"dataset": "no-such-corpus"}, "unknown dataset"),
        ({"epochs": "0"}, "greater than 0"),
        ({"new_tokens": "1"}, "greater than 1"),
        ({"lr": "nan"}, "finite"),
    ],
)
def test_bad_settings_are_one_line(settings, says):
    with pytest.raises(HarnessError) as err:
        attacks.build("distill", settings)
    assert says in str(err.value) and "\n" not in str(err.value), str(err.value)


def test_a_student_of_another_tokenizer_is_refused(random_llamas, other_tokenizer_llama):
    attack = attacks.build("distill", {"student": str(other_tokenizer_llama)})
    with pytest.raises(HarnessError, match="another tokenizer than the base model"):
        attack.validate(str(random_llamas[1]))
    attacks.build("distill", {"student": str(random_llamas[0])}).validate(str(random_llamas[1]))  # the same: fine


def test_one_student_per_n_from_one_draw(random_llamas, tmp_path):
    from harness.assets.models import load_causal_lm

    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in DOCS * 2))
    settings = {"texts": "4,8", "dataset": str(corpus), "prompt_tokens": 4, "new_tokens": 6, "batch_size": 2,
                "lr": 1e-2}  # fmt: skip
    attack = attacks.build("distill", settings)
    assert attack.outputs() == [("N=4", "students/n-4"), ("N=8", "students/n-8")]
    teacher, base = random_llamas
    out = tmp_path / "stage"
    out.mkdir()  # (the store makes a stage folder before the attack writes into it)
    report = attack.apply(teacher, out, AttackContext(base_model=str(base), device="cpu"))
    rows = [json.loads(line) for line in (out / "teacher_texts.jsonl").read_text().splitlines()]
    assert len(rows) == 8 and all(len(r["completion_ids"]) == 6 for r in rows)
    assert rows[0]["prompt_ids"] == rows[6]["prompt_ids"] and rows[0]["completion_ids"] != rows[6]["completion_ids"]
    assert report["training"][4]["steps"] == 2 and report["training"][8]["steps"] == 4
    weights = {}
    for n in (4, 8):
        model = load_causal_lm(str(out / f"students/n-{n}"), "cpu", dtype="float32")
        weights[n] = model.model.layers[0].mlp.up_proj.weight.detach().clone()
    start = load_causal_lm(str(base), "cpu", dtype="float32").model.layers[0].mlp.up_proj.weight
    assert not weights[4].equal(start) and not weights[4].equal(weights[8])  # trained, each on its own N


def test_a_lora_student_moves_only_its_adapted_projections(random_llamas, tmp_path):
    from harness.assets.models import load_causal_lm

    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in DOCS))
    settings = {"texts": "4", "dataset": str(corpus), "prompt_tokens": 4, "new_tokens": 6, "batch_size": 2,
                "lr": 5e-2, "lora_rank": 2}  # fmt: skip
    attack = attacks.build("distill", settings)
    teacher, base = random_llamas
    attack.validate(str(base))
    out = tmp_path / "stage"
    out.mkdir()
    report = attack.apply(teacher, out, AttackContext(base_model=str(base), device="cpu"))
    assert report["trained"] == "LoRA adapters of rank 2, merged"
    student = load_causal_lm(str(out / "students/n-4"), "cpu", dtype="float32").state_dict()
    start = load_causal_lm(str(base), "cpu", dtype="float32").state_dict()
    assert set(student) == set(start)  # merged back into a plain model
    moved = {name for name in start if not student[name].equal(start[name])}
    assert moved and all(name.endswith("_proj.weight") for name in moved), sorted(moved)
    with pytest.raises(HarnessError, match="rank 4096 is above the width"):
        attacks.build("distill", {"lora_rank": "4096"}).validate(str(base))


def test_the_distillation_table_sets_each_n_beside_the_unaltered_model(tmp_path, fake_run):
    from harness.report import collect, tables
    from harness.store.stages import Store

    store = Store(tmp_path / "runs")
    for method in ("gu-kgw", "pro"):
        fake_run(store, method, {}, "none", {}, 0.95)
        for output, auc in enumerate((0.6, 0.8)):
            fake_run(store, method, {}, "distill", {"texts": "100,1000"}, auc, output=output)
    written = tables.write_tables(collect.collect(store), tmp_path / "tables")
    folder = tmp_path / "tables" / "tiny"
    assert folder / "distill_curve.csv" in written and folder / "distill_curve.tex" in written
    with open(folder / "distill_curve.csv", newline="") as fh:
        rows = {r["setting"]: r for r in csv.DictReader(fh)}
    assert list(rows) == ["unaltered", "N=100", "N=1000"], list(rows)
    for method in ("Gu-KGW", "PRO"):
        aucs = [float(rows[k][f"{method} AUC"]) for k in rows]
        assert aucs[1] < aucs[2] < aucs[0], (method, aucs)  # (fake AUCs 0.6, 0.8 and 0.95 in expectation)
        lo, hi = float(rows["N=100"][f"{method} AUC_lo"]), float(rows["N=100"][f"{method} AUC_hi"])
        assert lo <= aucs[1] <= hi
    assert "per teacher texts N" in (folder / "distill_curve.tex").read_text()
    other = Store(tmp_path / "other")  # no distillation stored: no table
    fake_run(other, "gu-kgw", {}, "slerp", {"t": 0.5}, 0.8)
    tables.write_tables(collect.collect(other), tmp_path / "other-tables")
    assert not (tmp_path / "other-tables" / "tiny" / "distill_curve.csv").exists()


def test_each_student_has_a_control_student_of_the_base_and_is_read_against_it(random_llamas, small_preset, tmp_path):
    """Distillation is controlled (``Attack.controlled``): the same training applied to the unwatermarked base's own
    texts gives a control student per N, trained once for every method (its attack stage is keyed by the base), whose
    row is no configuration's and which each student's row is read against (``AUC_vs_control``)."""
    from harness.cell.pipeline import Pipeline
    from harness.config.registry import methods
    from harness.report import collect, frames
    from harness.store.files import read_jsonl
    from harness.store.stages import Store

    base = random_llamas[1]
    small = {"train.steps": "3", "train.batch_size": "2", "train.seq_len": "16", "eval.num_prompts": "6",
             "eval.prompt_tokens": "4", "eval.new_tokens": "8", "eval.batch_size": "3"}  # fmt: skip
    preset = small_preset(tmp_path, base, **small)
    corpus = tmp_path / "corpus.jsonl"
    settings = {"texts": "4,6", "dataset": str(corpus), "prompt_tokens": 4, "new_tokens": 6, "batch_size": 2}
    store = Store(tmp_path / "runs")
    cells = {}
    for name in ("gu-kgw", "gaussian-bias"):
        cells[name] = Pipeline(preset, store, "cpu").run(
            methods.build(name, {}, preset), attacks.build("distill", settings)
        )
    rows = [c.row for c in cells["gu-kgw"]]
    assert rows == ["Unwatermarked base", "Unaltered", "Distillation N=4", "Distillation N=6",
                    "Distillation N=4 of the base", "Distillation N=6 of the base"]  # fmt: skip
    controls = [[c for c in done if c.row.endswith("of the base")] for done in cells.values()]
    inputs = {json.loads((c.run.path / "spec.json").read_text())["upstream"]["attack"]["input"] for c in controls[0]}
    assert len(inputs) == 1 and inputs.pop().startswith("base:")  # the base, not a watermarked model
    gens = [[read_jsonl(c.run.path / "generations.jsonl") for c in side] for side in controls]
    assert gens[0] == gens[1]  # one control student per N, whichever method's cell asked for it

    df = collect.collect(store)
    control = df[df["control"]]
    assert len(control) == 4 and not control["main"].any()
    students = df[(df["attack_name"] == "distill") & ~df["control"]]
    assert students["AUC_vs_control"].notna().all() and control["AUC_vs_control"].isna().all()
    table = frames.curve(df, "distill")
    assert "Gu-KGW AUC_vs_control" in table.columns and list(table.index) == ["unaltered", "N=4", "N=6"]
    assert "of the base" not in " ".join(frames.robustness(df).index.get_level_values(1))


def test_a_student_that_is_no_causal_lm_is_refused_before_the_teacher_writes(random_llamas, tmp_path, cli):
    """A T5 (an encoder-decoder) with the base's very tokenizer: one line in the dry run, not after sampling the
    teacher's texts."""
    from transformers import T5Config, T5ForConditionalGeneration

    from harness.assets.models import load_tokenizer

    base = random_llamas[1]
    student = tmp_path / "t5"
    vocab = len(load_tokenizer(str(base)))
    T5ForConditionalGeneration(T5Config(vocab_size=vocab, d_model=16, d_kv=4, d_ff=32, num_layers=1, num_heads=2,
                                        decoder_start_token_id=0)).save_pretrained(student)  # fmt: skip
    load_tokenizer(str(base)).save_pretrained(student)
    out = cli("run", "--method", "gu-kgw", "--set", f"base_model={base}", "--set", f"oracle_model={base}",
              "--attack", "distill", "--attack-arg", f"student={student}", "--dry-run")  # fmt: skip
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert "is not a causal language model" in out.stderr
