"""Comparisons at matched quality: each row's texts measured beside the unwatermarked base's (perplexity ratio,
repetition, diversity), a quality gate that marks degenerate rows in every table and keeps them out of every ranking,
and the model-versus-model column (a row's texts against the base's own texts under the same detector)."""

import json

import pytest

from harness.cell.quality import ngram_share, text_quality
from harness.cli.main import main
from harness.config.gate import QualityGate
from harness.config.presets import TINY
from harness.config.settings import apply_overrides
from harness.report import collect, frames
from harness.store.stages import Store


def seq_rep(ids, n):
    """Welleck et al.'s seq-rep-n, written from its definition: the share of a text's n-grams already seen earlier."""
    seen, repeated, grams = set(), 0, 0
    for i in range(len(ids) - n + 1):
        gram = tuple(ids[i : i + n])
        repeated += gram in seen
        grams += 1
        seen.add(gram)
    return repeated / grams


def test_repetition_and_diversity_of_known_texts():
    loop, varied, short = [5, 6, 7] * 6, list(range(18)), [1, 2]
    found = text_quality([loop, varied, short])
    assert found["rep3"] == pytest.approx((seq_rep(loop, 3) + seq_rep(varied, 3)) / 2)  # (too short for a 3-gram)
    assert seq_rep(loop, 3) == pytest.approx(13 / 16) and seq_rep(varied, 3) == 0
    assert found["distinct1"] == pytest.approx((3 / 18 + 1 + 1) / 3)
    assert found["distinct2"] == pytest.approx((3 / 17 + 1 + 1) / 3)
    assert ngram_share([], 1) is None and text_quality([[1]])["rep3"] is None


@pytest.mark.parametrize(
    ("ratio", "rep3", "base_rep3", "word"),
    [
        (1.2, 0.01, 0.01, "ok"),
        (1.49, 0.04, 0.0, "ok"),  # (a base that never repeats: the floor bounds repetition, not 3 x 0)
        (1.6, 0.01, 0.01, "degenerate"),  # watermarked text half as unlikely again as the base's
        (0.27, 0.84, 0.05, "degenerate"),  # a loop its judge finds likely
        (1.0, 0.2, 0.02, "degenerate"),  # the base's perplexity, but a loop
        (1.0, None, 0.02, "unknown"),  # no repetition stored: cannot tell
        (None, 0.01, 0.01, "unknown"),
    ],
)
def test_the_gate_judges_each_row_against_its_base(ratio, rep3, base_rep3, word):
    verdict = QualityGate().verdict(ratio, rep3, base_rep3)
    assert verdict.split(":")[0] == word, verdict
    if word == "degenerate":
        assert ("PPL" in verdict) == (not 2 / 3 <= ratio <= 1.5) and ("3-grams" in verdict) == (rep3 > 0.05)


@pytest.mark.parametrize(
    "setting",
    [
        "quality_gate.ppl_ratio=[2, 1]",  # inverted
        "quality_gate.ppl_ratio=[0.5, 0.9]",  # excludes the base itself
        "quality_gate.ppl_ratio=[0, 2]",
        "quality_gate.ppl_ratio=[0.5, Infinity]",
        "quality_gate.ppl_ratio=[0.5]",
        "quality_gate.rep3_ratio=1",
        "quality_gate.rep3_ratio=nan",
        "quality_gate.rep3_floor=-0.1",
        "quality_gate.rep3_floor=1",
        "quality_gate.perplexity=2",  # no such setting
    ],
)
def test_a_gate_that_cannot_judge_is_one_line_before_any_work(setting, capsys):
    code = main(["run", "--method", "gu-kgw", "--attack", "none", "--set", setting, "--dry-run"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "quality_gate" in err, err


def test_bounds_given_without_json_are_refused_with_the_form_that_works(capsys):
    assert main(["run", "--method", "gu-kgw", "--set", "quality_gate.ppl_ratio=0.5,1.5", "--dry-run"]) == 2
    assert "(write a list in JSON: --set quality_gate.ppl_ratio='[0.5,1.5]')" in capsys.readouterr().err
    assert main(["run", "--method", "gu-kgw", "--set", "quality_gate.ppl_ratio=[0.5,1.5]", "--dry-run"]) == 0


@pytest.mark.parametrize("role", ["--oracle-model", "--base-model"])
def test_a_base_or_judge_that_is_no_causal_lm_is_one_line_before_any_work(random_t5, role, tmp_path, capsys):
    """The judge scores next tokens and the base writes: a sequence-to-sequence model (here a T5 paraphraser) is
    refused by the dry run and the run alike, before anything trains or loads weights."""
    for dry in (["--dry-run"], []):
        code = main(["run", "--method", "gu-kgw", role, str(random_t5), "--results", str(tmp_path / "runs"), *dry])
        err = capsys.readouterr().err.strip()
        assert code == 2 and len(err.splitlines()) == 1, err
        assert f"{role[2:].replace('-', '_')}: model '{random_t5}' is not a causal language model" in err, err
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def unreadable_judges(folder):
    """Two causal LMs that cannot read text: one holding another model's tokenizer (its ids run past its 40
    embeddings), one whose tokenizer reads every word as its unknown token."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from harness.assets.tiny import build_tokenizer
    from tests.conftest import SENTENCES, make_random_llama

    other = make_random_llama(folder / "other", 4, build_tokenizer(SENTENCES), vocab_size=40)
    words = Tokenizer(models.WordLevel({"<unk>": 0, **{f"zz{i}": i for i in range(1, 64)}}, unk_token="<unk>"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    unknown = PreTrainedTokenizerFast(tokenizer_object=words, unk_token="<unk>", eos_token="<unk>", pad_token="<unk>")
    return {"ids up to": other, "as its unknown token": make_random_llama(folder / "unknown", 5, unknown)}


@pytest.mark.parametrize("role", ["--oracle-model", "--base-model"])
def test_a_judge_or_base_that_cannot_read_text_is_one_line_before_any_work(role, tmp_path, capsys):
    """A judge whose tokenizer is another model's crashed after generation (an index past its embeddings); one that
    reads every word as unknown stored a perplexity of 4096 for every row, all "ok"."""
    for words, folder in unreadable_judges(tmp_path).items():
        for dry in (["--dry-run"], []):
            code = main(["run", "--method", "gu-kgw", role, str(folder), "--results", str(tmp_path / "runs"), *dry])
            err = capsys.readouterr().err.strip()
            assert code == 2 and len(err.splitlines()) == 1 and words in err, err
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_the_default_gate_moves_no_hash_and_another_is_recorded():
    assert "quality_gate" not in TINY.hashed()  # every stored run keeps its hash
    custom = apply_overrides(TINY, {"quality_gate.ppl_ratio": "[0.5, 2]"})
    assert custom.hashed()["quality_gate"] == {"ppl_ratio": (0.5, 2.0), "rep3_ratio": 3.0, "rep3_floor": 0.05}


@pytest.fixture
def gated_store(tmp_path, fake_run):
    """Gu-KGW and PRO with their base rows: Gu-KGW writes like its base; PRO's unaltered model loops and its SLERP
    model writes token noise (100x the base's perplexity)."""
    store = Store(tmp_path / "runs")
    for method in ("gu-kgw", "pro"):
        fake_run(store, method, {}, "base", {}, 0.5)
    fake_run(store, "gu-kgw", {}, "none", {}, 0.97, ppl_scale=1.2)
    fake_run(store, "gu-kgw", {}, "slerp", {"t": 0.5}, 0.8)
    fake_run(store, "pro", {}, "none", {}, 0.99, loop=True)
    fake_run(store, "pro", {}, "slerp", {"t": 0.5}, 0.9, ppl_scale=100)
    return store


def test_degenerate_rows_are_named_in_every_table_and_never_ranked(gated_store, tmp_path):
    df = collect.collect(gated_store)
    verdict = {(r.method, r.attack): r.quality for r in df.itertuples()}
    assert verdict[("Gu-KGW", "")] == verdict[("Gu-KGW", "SLERP")] == verdict[("PRO", "No watermark")] == "ok"
    assert verdict[("PRO", "")].startswith("degenerate: repeats")
    assert verdict[("PRO", "SLERP")].startswith("degenerate: PPL")
    for r in df.itertuples():  # the metrics of every row are its stored ones, gate or not
        stored = json.loads((gated_store.root / r.run / "metrics.json").read_text())
        assert r.AUC == stored["auc"] and r.PPL == stored["median_ppl"] and r.rep3 == stored["rep3"]

    table = frames.robustness(df)
    assert table.loc[("Unaltered", "", ""), ("PRO", "quality")] == "degenerate"
    assert table.loc[("Merging", "SLERP", "t=0.5"), ("Gu-KGW", "quality")] == "ok"
    compared = frames.comparison(df, gated_store)
    for row in (("Unaltered", "", ""), ("Merging", "SLERP", "t=0.5")):
        pair = compared.loc[(*row, "Gu-KGW", "PRO")]
        assert pair["note"].startswith("not ranked: PRO (seed 0) degenerate") and pair["dAUC"] != pair["dAUC"]

    out = tmp_path / "tables"
    assert main(["tables", "--results", str(gated_store.root), "--out", str(out), "--no-figures"]) == 0
    import pandas as pd

    runs = pd.read_csv(out / "runs.csv")
    assert sorted(runs["quality"].str.split(":").str[0]) == ["degenerate"] * 2 + ["ok"] * 4
    assert list(runs.columns[-8:-1]) == ["PPL_ratio", "PPL_ratio_lo", "PPL_ratio_hi", "rep3_base", "quality",
                                         "AUC_vs_base", "TPR@1%_vs_base"]  # fmt: skip
    for r in runs.itertuples():  # every row's ratio inside its interval; a base row's is exactly 1
        assert r.PPL_ratio_lo <= r.PPL_ratio <= r.PPL_ratio_hi
        assert (r.PPL_ratio_lo == r.PPL_ratio_hi == 1) == (r.attack == "No watermark")
    assert "& degenerate" in (out / "tiny" / "robustness.tex").read_text()
    assert "not ranked: PRO" in (out / "tiny" / "comparison.tex").read_text()
    assert "PPL judged by builtin:tiny-lm" in (out / "tiny" / "robustness.tex").read_text()


def test_model_versus_model_reads_each_row_against_its_base_texts(gated_store):
    df = collect.collect(gated_store)
    base = df[collect.base_rows(df)]
    assert list(base["AUC_vs_base"]) == [0.5, 0.5] and list(base["PPL_ratio"]) == [1.0, 1.0]  # by construction
    row = df[(df["method"] == "Gu-KGW") & (df["attack"] == "")].iloc[0]
    pos = [s["score"] for s in collect.scores(gated_store, row["run"]) if s["label"] == 1]
    ref_run = base[base["method"] == "Gu-KGW"].iloc[0]["run"]
    ref = [s["score"] for s in collect.scores(gated_store, ref_run) if s["label"] == 1]
    wins = sum((p > q) + 0.5 * (p == q) for p in pos for q in ref) / (len(pos) * len(ref))
    assert row["AUC_vs_base"] == pytest.approx(wins, abs=1e-12) and row["AUC_vs_base"] > 0.8
    compared = frames.comparison(df[df["method"] == "Gu-KGW"], gated_store)
    assert compared.empty  # one method: nothing to compare


def test_a_method_calibrated_outside_the_budget_is_shown_at_matched_quality_and_never_ranked(tmp_path, fake_run):
    """A calibration that chose outside the budget (``over_budget: closest``): its method's rows stay in the table at
    matched quality, whose caption says why, and every pair with it in tab:comparison at matched quality keeps its
    row with no numbers; tab:comparison at fixed settings, where the gate alone rules, still orders it."""
    from harness.config.registry import methods
    from harness.store import kinds

    store = Store(tmp_path / "runs")
    for method, within in (("gu-kgw", True), ("pro", False)):
        base = fake_run(store, method, {}, "base", {}, 0.5)
        unaltered = fake_run(store, method, {}, "none", {}, 0.95)
        fake_run(store, method, {}, "slerp", {"t": 0.5}, 0.8)
        stage = store.stage(kinds.CALIBRATION, {"stage": kinds.CALIBRATION, "method": method, "setting": "delta",
                                                "runs": [[base.name, unaltered.name]]})  # fmt: skip
        settings = methods.build(method, {}, TINY).params.model_dump()  # (as a calibration stores its choice)
        chosen = {"settings": settings, "value": 1.0, "within_budget": within, "PPL_ratio": 1.1 if within else 1.45}

        def make(folder, chosen=chosen):
            (folder / "calibration.json").write_text(json.dumps({"chosen": chosen, "sweep": []}))
            return {}

        store.build_or_reuse(stage, f"calibration of {method}", make)
    out = tmp_path / "tables"
    assert main(["tables", "--results", str(store.root), "--out", str(out), "--no-figures"]) == 0
    import pandas as pd

    matched = pd.read_csv(out / "tiny" / "matched_comparison.csv")
    assert len(matched) == 2 and (matched["dAUC"] == "missing").all()  # unaltered and SLERP: kept, no numbers
    assert matched["note"].str.startswith("not ranked: PRO").all() and matched["note"].str.contains("1.45x").all()
    caption = " ".join((out / "tiny" / "matched.tex").read_text().split())
    assert "; PRO: outside the budget (the closest: 1.45x" in caption
    fixed = pd.read_csv(out / "tiny" / "comparison.csv")
    assert len(fixed) == 2 and fixed["dAUC"].astype(float).notna().all()


def test_the_spoofing_table_at_matched_quality_reads_the_chosen_configuration(tmp_path, fake_run):
    """Spoofing's table of its own (``<attack>_flagged``) shows each method's main configuration, the preset's; where a
    calibration chose another, ``<attack>_flagged_matched`` shows that one's rows, and its caption names it."""
    from harness.config.registry import methods
    from harness.store import kinds

    store = Store(tmp_path / "runs")
    runs = {}
    for delta, auc in ((None, 0.6), (1.5, 0.9)):
        settings = {} if delta is None else {"delta": delta}
        runs[delta] = [fake_run(store, "gu-kgw", settings, "base", {}, 0.5),
                       fake_run(store, "gu-kgw", settings, "none", {}, 0.95)]  # fmt: skip
        fake_run(store, "gu-kgw", settings, "steal-spoof", {"texts": 100}, auc)
    stage = store.stage(kinds.CALIBRATION, {"stage": kinds.CALIBRATION, "method": "gu-kgw", "setting": "delta",
                                            "runs": [[r.name for r in runs[1.5]]]})  # fmt: skip
    chosen = methods.build("gu-kgw", {"delta": "1.5"}, TINY).params.model_dump()

    def make(folder):
        (folder / "calibration.json").write_text(json.dumps({"chosen": {"settings": chosen, "value": 1.5},
                                                             "sweep": []}))  # fmt: skip
        return {}

    store.build_or_reuse(stage, "calibration of gu-kgw", make)
    out = tmp_path / "tables"
    assert main(["tables", "--results", str(store.root), "--out", str(out), "--no-figures"]) == 0
    import pandas as pd

    fixed = pd.read_csv(out / "tiny" / "steal-spoof_flagged.csv", index_col=0)
    matched = pd.read_csv(out / "tiny" / "steal-spoof_flagged_matched.csv", index_col=0)
    assert list(matched.index) == list(fixed.index) == ["the base's own texts", "N=100, strength=4"]
    assert fixed.loc["N=100, strength=4", "Gu-KGW AUC"] == pytest.approx(0.6, abs=0.1)
    assert matched.loc["N=100, strength=4", "Gu-KGW AUC"] == pytest.approx(0.9, abs=0.1)
    caption = " ".join((out / "tiny" / "steal-spoof_flagged_matched.tex").read_text().split())
    assert "At matched quality" in caption and "Gu-KGW: k=1, delta=1.5)." in caption


def test_the_ppl_ratio_interval_resamples_prompts_on_both_sides_at_once():
    """Each draw takes the same prompts for the row and its base: a row that reads every prompt exactly twice its
    base's perplexity has the interval [2, 2] however much the prompts differ, where resampling each side alone
    would spread it; prompts only one side continued are left out, and too few shared ones give none."""
    from harness.cell import metrics

    base = {i: float(5 + 40 * (i % 7)) for i in range(50)}
    assert metrics.ratio_interval({i: 2 * v for i, v in base.items()} | {99: 1e6}, base) == pytest.approx((2, 2))
    lo, hi = metrics.ratio_interval({i: v * (1.5 if i % 2 else 0.9) for i, v in base.items()}, base)
    assert lo < hi and lo >= 0.9 and hi <= 1.5
    assert metrics.ratio_interval({0: 1.0}, {0: 1.0, 1: 2.0}) is None
    assert metrics.ratio_interval({0: 1.0, 1: 2.0}, {0: 0.0, 1: 2.0}) is None
