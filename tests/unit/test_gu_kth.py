"""Gu-KTH through the pipeline: the teacher texts are a stage of their own (shared by students of the same key and
data), the detector's reference statistics another (shared by every run of the key), p-values are Gu et al.'s, and
bad settings are refused before any training."""

import json

import pytest

from harness.cell.pipeline import Pipeline
from harness.config.errors import HarnessError
from harness.config.registry import attacks, methods
from harness.store.files import read_jsonl
from harness.store.stages import Store

PRESET = {"train.steps": "2", "train.batch_size": "2", "train.seq_len": "12", "eval.num_prompts": "4",
          "eval.prompt_tokens": "4", "eval.new_tokens": "8", "eval.batch_size": "2"}  # fmt: skip


SETTINGS = {"s": "2", "m": "16", "prompt_tokens": "4", "reference_texts": "20", "generate_batch": "3"}


def test_teacher_texts_and_reference_are_shared_stages(random_llamas, tmp_path, small_preset):
    base, _ = random_llamas
    store = Store(tmp_path / "runs")
    cells = Pipeline(small_preset(tmp_path, base, **PRESET), store, "cpu").run(
        methods.build("gu-kth", SETTINGS), attacks.build("none", {})
    )
    stages = tmp_path / "runs" / "stages"
    (teacher,) = list((stages / "kth-teacher-texts").iterdir())
    texts = read_jsonl(teacher / "texts.jsonl")
    assert len(texts) == 2 * 2  # one text per training sequence (steps x batch)
    # s = 2 evenly spaced shifts of m = 16, one per text drawn as Gu et al. (random.Random(42).choice)
    assert [t["shift"] for t in texts] == [0, 0, 8, 0]
    (reference,) = list((stages / "kth-reference").iterdir())
    ref = json.loads((reference / "reference.json").read_text())["statistics"]
    assert len(ref) == 20  # reference_texts: the corpus has 24 documents long enough
    for cell in cells:
        for s in read_jsonl(cell.run.path / "scores.jsonl"):
            assert s["score"] == -s["statistic"]
            assert 1 / (len(ref) + 1) <= s["p_value_gu"] <= 1  # Gu et al.'s rank against the human reference
            assert "p_value" not in s  # no per-text p-value: that rank holds no level for a model's texts
    # Another student of the same key and data (another learning rate) reuses both stages.
    other = small_preset(tmp_path, base, **PRESET, **{"train.lr": "2e-3"})
    Pipeline(other, store, "cpu").run(methods.build("gu-kth", SETTINGS), attacks.build("none", {}))
    assert len(list((stages / "train").iterdir())) == 2
    assert len(list((stages / "kth-teacher-texts").iterdir())) == 1
    assert len(list((stages / "kth-reference").iterdir())) == 1


@pytest.mark.parametrize(
    "settings, message",
    [({"s": "0"}, "s: Input should be greater"), ({"s": "300"}, "must be in 1..m=256"), ({"m": "0"}, "m: Input"),
     ({"statistic": "hamming"}, "statistic: Input should be 'levenshtein' or 'min-offset'")],
)  # fmt: skip
def test_bad_settings_are_refused(settings, message):
    with pytest.raises(HarnessError, match=message):
        methods.build("gu-kth", settings)


def test_key_vocabulary_must_match_the_model(random_llamas):
    from harness.assets.models import load_tokenizer

    base, _ = random_llamas
    size = len(load_tokenizer(str(base)))
    methods.build("gu-kth", {"vocab_size": str(size)}).validate(str(base))
    with pytest.raises(HarnessError, match="differs from the base model's vocabulary"):
        methods.build("gu-kth", {"vocab_size": str(size + 1)}).validate(str(base))


def test_detect_pools_kth_statistics_by_a_permutation_test(random_llamas, tmp_path, small_preset, cli):
    """``harness detect`` with a Gu-KTH key: one decision by the permutation test of the texts' summed statistic over
    keys drawn afresh, and each text's own permutation p-value from the same keys (its statistic against its
    statistics under them, recomputed here); the setup (prompts, lengths, reference data) is that of the key's
    stored runs."""
    base, _ = random_llamas
    store = Store(tmp_path / "runs")
    Pipeline(small_preset(tmp_path, base, **PRESET), store, "cpu").run(
        methods.build("gu-kth", SETTINGS), attacks.build("none", {})
    )
    (key,) = [p.name for p in (store.root / "stages" / "train").iterdir()]
    texts = tmp_path / "texts.txt"
    texts.write_text("The quick brown fox jumps over the lazy dog.\nA watermark is a hidden signal in text.\n")
    out = cli("detect", "--results", str(store.root), "--key", key, "--texts", str(texts), "--json")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    d = report["decision"]
    assert "permutation test of the texts' summed KTH statistic against the same texts under 199 keys" in d["test"]
    assert 1 / 200 <= d["p_value"] <= 1 and d["p_value"] * 200 == round(d["p_value"] * 200)
    assert d["human_texts"] == 4
    from harness.assets.models import load_tokenizer
    from harness.contract.method import read_key
    from methods.kth import KTHKey, null_key, statistics

    saved = read_key(store.root / "stages" / "train" / key)
    kth = KTHKey.from_dict(saved["key"])
    tok = load_tokenizer(str(base))
    lines = texts.read_text().splitlines()
    ids = tok(lines, add_special_tokens=False)["input_ids"]
    own = statistics(kth, ids, saved["statistic"], saved["gamma"])
    null = [statistics(null_key(kth, j), ids, saved["statistic"], saved["gamma"]) for j in range(199)]
    for i, row in enumerate(report["texts"]):
        assert row["p_value"] == (1 + sum(n[i] <= own[i] for n in null)) / 200  # exact: a count over keys
        assert 0 < row["p_value_gu"] <= 1  # Gu et al.'s rank, kept under its own name
    assert len(list((store.root / "stages" / "kth-reference").iterdir())) == 1  # the run's reference, reused
