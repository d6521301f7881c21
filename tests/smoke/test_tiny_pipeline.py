"""End to end on the tiny preset, through the installed CLI, in the smoke tests' shared store: the watermark is
learned, SLERP weakens it, the base model shows none, a second run reuses everything, and the tables are rebuilt from
the store alone."""

import json
import os
import shutil

import pytest

pytestmark = pytest.mark.smoke
RUN = ("run", "--method", "gu-kgw", "--attack", "slerp", "--attack-arg", "t=0.5", "--results")


@pytest.fixture(scope="module")
def store(shared_store, harness):
    """The Gu-KGW x SLERP t=0.5 cell (trained here, or reused where another test's process trained it); returns
    (the store, the command's output)."""
    out = harness(*RUN, str(shared_store), timeout=1800)
    assert out.returncode == 0, out.stderr[-3000:]
    return shared_store, out


@pytest.fixture
def metrics_by_row(runs_by_row):
    return lambda root: {row: metrics for row, (_, metrics) in runs_by_row(root, "slerp").items()}


def test_watermark_learned_and_weakened_by_slerp(store, metrics_by_row):
    root, out = store
    m = metrics_by_row(root)
    assert set(m) == {"Unwatermarked base", "Unaltered", "SLERP t=0.5"}
    base, marked, merged = m["Unwatermarked base"]["auc"], m["Unaltered"]["auc"], m["SLERP t=0.5"]["auc"]
    assert marked > 0.9, m
    assert 0.35 < base < 0.65, m
    assert base + 0.05 < merged < marked, m
    assert "Unaltered" in out.stdout and "SLERP t=0.5" in out.stdout and "AUC" in out.stdout


def test_run_folder_holds_everything(store, runs_by_row):
    root, _ = store
    mine = {spec["row"] for spec, _ in runs_by_row(root, "slerp").values()}
    for run in (p.parent for p in root.glob("*/DONE")):
        spec = json.loads((run / "spec.json").read_text())
        if spec["row"] not in mine or spec["config"]["method"]["name"] != "gu-kgw":
            continue  # another smoke test's method or attack in the shared store
        for name in ("spec.json", "manifest.json", "generations.jsonl", "scores.jsonl", "metrics.json"):
            assert (run / name).is_file(), (run, name)
        manifest = json.loads((run / "manifest.json").read_text())
        assert manifest["versions"]["transformers"] and manifest["versions"]["torch"]
        # What making the run took at most, stage by stage, training included (an exported run has no stage folders)
        upstream = manifest["report"]["upstream_peak_memory"]
        assert {"train", "generate"} <= set(upstream) <= {"train", "attack", "generate"}, upstream
        assert ("attack" in upstream) == (spec["config"]["attack"]["name"] == "slerp"), upstream
        for name, peak in upstream.items():
            kind, key = peak["stage"].split("/")
            stage = json.loads((root / "stages" / kind / key / "manifest.json").read_text())
            assert peak["rss_bytes"] == stage["peak_memory"]["rss_bytes"] > 50 * 2**20, (name, peak)
        gens = [json.loads(line) for line in (run / "generations.jsonl").read_text().splitlines()]
        assert len(gens) == 200 and all(len(g["completion_ids"]) == 64 for g in gens)
        assert all(len(g["human_ids"]) == 64 for g in gens)
    # One Gu-KGW student (other smoke tests add other methods' to the shared store), its key beside the model.
    gu_kgw = [
        p.parent
        for p in (root / "stages" / "train").glob("*/spec.json")
        if json.loads(p.read_text())["method"] == "gu-kgw"
    ]
    assert len(gu_kgw) == 1 and (gu_kgw[0] / "model" / "model.safetensors").is_file()
    assert json.loads((gu_kgw[0] / "key.json").read_text())["detector"]["seeding_scheme"] == "simple_1"


def test_second_run_reuses_every_stage(store, harness):
    root, _ = store
    out = harness(*RUN, str(root), timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "computing" not in out.stderr
    assert out.stderr.count("reusing") == 11  # train, attack, 3 generations, 3 held-out perplexities, 3 runs
    assert out.stdout.count("(reused)") == 3


def test_a_dry_run_lists_the_stored_runs_and_the_missing_ones(store, cli, tmp_path):
    """``harness run --dry-run``: each run of the command, stored or to compute, and nothing computed or written. It
    reads a copy of the shared store (hard links), which no other test's process writes into meanwhile."""
    root = tmp_path / "runs"
    shutil.copytree(store[0], root, ignore=shutil.ignore_patterns(".*"), copy_function=os.link)  # (no locks, partials)
    before = sorted(p.relative_to(root) for p in root.rglob("*"))
    out = cli(*RUN, str(root), "--dry-run")
    assert out.returncode == 0, out.stderr
    assert [line.split() for line in out.stdout.splitlines() if line.startswith("  ")] == [
        ["Unwatermarked", "base", "stored"], ["Unaltered", "stored"], ["SLERP", "t=0.5", "stored"]
    ]  # fmt: skip
    assert f"3 of 3 runs stored in {root}; 0 to compute" in out.stdout
    out = cli(*RUN[:-2], "t=0.3", "--results", str(root), "--dry-run")  # the same model, merged otherwise
    assert out.returncode == 0, out.stderr
    assert "SLERP t=0.3" in out.stdout and f"2 of 3 runs stored in {root}; 1 to compute" in out.stdout
    assert sorted(p.relative_to(root) for p in root.rglob("*")) == before


def test_the_tiny_lm_is_what_its_recipe_planned(store):
    """The checks before a first run judge the unbuilt tiny LM by the config its recipe gives (shapes, context length,
    vocabulary: ``models.planned_config``); the built model has exactly that config, but for its special tokens' ids
    and what saving adds."""
    from transformers import AutoConfig

    from harness.assets import models, tiny
    from harness.config.refs import TINY_LM

    folder = models.resolve(TINY_LM)
    added = {"bos_token_id", "eos_token_id", "pad_token_id", "architectures", "dtype", "_name_or_path"}
    built = {k: v for k, v in AutoConfig.from_pretrained(folder).to_dict().items() if k not in added}
    planned = {k: v for k, v in tiny.planned_config().to_dict().items() if k not in added}
    assert planned == built
    assert len(models.load_tokenizer(folder)) == planned["vocab_size"]


def test_tables_from_the_store(store, cli, tmp_path):
    root, _ = store
    out = cli("tables", "--results", str(root), "--out", str(tmp_path))
    assert out.returncode == 0, out.stderr
    csv = (tmp_path / "tiny" / "robustness.csv").read_text()
    assert "SLERP" in csv and "Unaltered" in csv and "Gu-KGW" in csv
    tex = (tmp_path / "tiny" / "robustness.tex").read_text()
    assert r"\cellcolor{green!25}" in tex and r"\begin{tabular}" in tex
