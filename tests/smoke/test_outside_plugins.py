"""Three methods (one that trains nothing, one on the training loop of the built-in ones) and four attacks from a
package outside the harness (tests/smoke/outside/outside_plugins.py), installed in a folder of their own and registered
only through entry points, run through `harness run` and `harness grid` and appear in every table they belong in, the
report and `harness detect`, with no edit to harness/: a new attack category becomes a row group of tab:robustness, a
new text attack gets a table of its own, and a new method becomes a column."""

import csv
import json
import os
import shutil
import subprocess
from pathlib import Path

import pandas as pd
import pytest

pytestmark = pytest.mark.smoke

SETTINGS = {
    "train.steps": "3",
    "train.batch_size": "2",
    "train.seq_len": "16",
    "eval.num_prompts": "6",
    "eval.prompt_tokens": "4",
    "eval.new_tokens": "8",
    "eval.batch_size": "3",
}
ENTRY_POINTS = """\
[harness.methods]
unigram = outside_plugins:Unigram
untrained-kgw = outside_plugins:Untrained
green-tune = outside_plugins:GreenTune

[harness.attacks]
noise = outside_plugins:Noise
truncate = outside_plugins:Truncate
noise-sweep = outside_plugins:NoiseSweep
best-of-n = outside_plugins:BestOfN
"""


@pytest.fixture(scope="module")
def outside(tmp_path_factory, random_llamas, script):
    """``run(*args)``: the harness console script with the outside package installed beside it (a folder on
    PYTHONPATH holding the module and its .dist-info with entry_points.txt, as pip would install it)."""
    root = tmp_path_factory.mktemp("outside")
    site = root / "site"
    (site / "outside_plugins-0.1.dist-info").mkdir(parents=True)
    shutil.copy(Path(__file__).parent / "outside" / "outside_plugins.py", site / "outside_plugins.py")
    (site / "outside_plugins-0.1.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: outside-plugins\n"
                                                                     "Version: 0.1\n")  # fmt: skip
    (site / "outside_plugins-0.1.dist-info" / "entry_points.txt").write_text(ENTRY_POINTS)
    corpus = root / "corpus.jsonl"
    texts = [
        "The quick brown fox jumps over the lazy dog and runs into the forest to find more food today.",
        "A watermark is a hidden signal in generated text that a detector can find with a secret key.",
    ] * 12
    corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    paths = {"base_model": str(random_llamas[1]), "oracle_model": str(random_llamas[1]),
             "train_data.path": str(corpus), "eval_data.path": str(corpus)}  # fmt: skip
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))}

    def run(*args: str, code: int = 0) -> subprocess.CompletedProcess:
        out = subprocess.run([script("harness"), *args], capture_output=True, text=True, env=env, timeout=900)
        assert out.returncode == code, out.stderr[-3000:]
        return out

    return run, root, {**paths, **SETTINGS}


def test_outside_plugins_run_and_fill_the_tables(outside):
    run, root, settings = outside
    listed = {line.split()[0] for line in run("list").stdout.splitlines()[1:] if line.strip()}
    assert {"unigram", "untrained-kgw", "green-tune", "noise", "truncate", "noise-sweep", "best-of-n"} <= listed
    store = root / "runs"
    sets = [a for k, v in settings.items() for a in ("--set", f"{k}={v}")]
    out = run("run", "--method", "unigram", "--attack", "truncate", "--attack-arg", "keep=0.5", *sets,
              "--results", str(store))  # fmt: skip
    assert "Truncation keep=0.5" in out.stdout
    # The method that trains, on the loop every built-in method uses: its steps in its train stage's log, a student
    # that is no longer the base, and its rows under an outside attack.
    tuned = root / "tuned"  # (a store of its own: the grid's tables below hold the grid's methods)
    out = run("run", "--method", "green-tune", "--attack", "noise", *sets, "--results", str(tuned))
    assert "Gaussian noise sigma=0.05" in out.stdout, out.stdout
    (trained,) = [p.parent for p in tuned.glob("stages/train/*/spec.json")]
    log = json.loads((trained / "manifest.json").read_text())["report"]
    assert log["steps"] == 3 and len(log["losses"]) == 3, log
    from safetensors.torch import load_file

    folders = (trained / "model", Path(settings["base_model"]))
    student, base = (load_file(next(folder.glob("*.safetensors"))) for folder in folders)
    assert any((student[name] != base[name]).any() for name in base), "green-tune's student is the base unchanged"
    # An outside attack refuses a method before any training (``Attack.refuses``), in one line.
    out = run("run", "--method", "kth-decoding", "--attack", "best-of-n", *sets, "--results", str(store), code=2)
    assert "every draw is the same text" in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr
    spec = root / "grid.yaml"
    overrides = "".join(f"  {k}: {v}\n" for k, v in settings.items())
    groups = (
        "groups:\n  g:\n    methods: {unigram: [{}], gu-kgw: [{}], untrained-kgw: [{}]}\n"
        "    attacks: {none: [{}], noise: [{sigma: 0.05}], truncate: [{keep: 0.5}],\n"
        "              noise-sweep: [{sigmas: [0.02, 0.05]}], best-of-n: [{n: 2}],\n"
        # a chain of the outside attacks: the model attack, then the text attack on what that model wrote
        "              chain: [{links: [{attack: noise, settings: {sigma: 0.05}}, {attack: truncate}]}]}\n"
    )
    spec.write_text(f"preset: tiny\noverrides:\n{overrides}{groups}")
    out = run("grid", str(spec), "--results", str(store))
    assert "18 cells:" in out.stdout and "0 failed" in out.stdout, out.stdout
    tables = root / "tables"
    run("tables", "--results", str(store), "--out", str(tables))
    with open(tables / "tiny" / "robustness.csv") as fh:
        rows = list(csv.reader(fh))
    methods = set(rows[0][3:])
    assert {"Unigram", "Gu-KGW", "Untrained KGW"} <= methods, rows[0]  # the new methods are columns
    noise = [r for r in rows if r[0] == "Perturbation"]
    assert [r[1:3] for r in noise] == [["Gaussian noise", "sigma=0.05"]]  # the new category is a row group
    assert "missing" not in noise[0][3:], noise  # with a number for both methods
    # The attack of a kind of its own: a row group, a row per model it asked the pipeline for, each with a number.
    swept = [r for r in rows if r[0] == "Perturbation sweeps"]
    assert [r[1:3] for r in swept] == [["Noise sweep", "sigma=0.02"], ["Noise sweep", "sigma=0.05"]], swept
    assert not [cell for r in swept for cell in r[3:] if cell == "missing"], swept
    # its sigma = 0.05 model is the noise attack's own stage, asked for again: the two rows read the same AUC
    assert swept[1][3:] == noise[0][3:], (swept, noise)
    # the table it declares (SettingTable): a row per scale after the unaltered model, three columns per method
    by_scale = pd.read_csv(tables / "tiny" / "noise-sweep_by_scale.csv", index_col=0, na_values=["missing"])
    assert list(by_scale.index) == ["unaltered", "sigma=0.02", "sigma=0.05"], by_scale
    assert {"Gu-KGW AUC", "Unigram TPR@1%", "Untrained KGW PPL"} <= set(
        by_scale.columns
    ) and by_scale.notna().all().all()
    assert "at each noise scale" in (tables / "tiny" / "noise-sweep_by_scale.tex").read_text()
    # The attack that draws several samples per prompt: its row, from a stage of its own keyed by the draws it read.
    best = [r for r in rows if r[0] == "Sampling"]
    assert [r[1:3] for r in best] == [["Best of N", "N=2"]] and "missing" not in best[0][3:], best
    made = [s for s in (json.loads(p.read_text()) for p in store.glob("stages/generate/*/spec.json")) if "made_by" in s]
    assert {s["made_by"]["attack"] for s in made} == {"best-of-n"} and all(len(s["made_by"]["reads"]["draws"]) == 2
                                                                            for s in made)  # fmt: skip
    assert not [r for r in rows if r[0] == "Editing"]  # a text attack has a table of its own, not these rows
    chained = [r for r in rows if r[0] == "Chains"]
    assert [r[1:3] for r in chained] == [["Gaussian noise → Truncation", "sigma=0.05 → keep=0.5"]], chained
    assert "missing" not in chained[0][3:], chained
    own = pd.read_csv(tables / "tiny" / "truncate.csv", header=[0, 1], index_col=0)
    assert list(own.index) == ["Gu-KGW", "Unigram", "Untrained KGW"]  # registered methods first, then outside ones
    assert own[("keep=0.5", "AUC")].notna().all()
    tex = (tables / "tiny" / "truncate.tex").read_text()
    assert "AUC under truncation of each text" in tex and "Truncation (keep=0.5)" in tex
    # The method that trains nothing: its column of its own in runs.csv, its rows in tokens to detect and the report,
    # and its key in harness detect.
    runs = pd.read_csv(tables / "runs.csv", na_values=["missing"])  # (how the tables write an empty cell)
    green = runs.loc[runs["method_name"] == "untrained-kgw", "untrained-kgw.green"]
    assert len(green) and green.notna().all() and (green > 0).all(), green
    assert runs.loc[runs["method_name"] != "untrained-kgw", "untrained-kgw.green"].isna().all()
    tokens = pd.read_csv(tables / "tiny" / "tokens_to_detect.csv")
    assert "Untrained KGW" in set(tokens["method"]), tokens["method"].unique()
    page = root / "report.html"
    run("report", "--results", str(store), "--out", str(page))
    assert "Untrained KGW" in page.read_text() and "Perturbation sweeps" in page.read_text()
    # (each declared table under its heading by its file and caption: several would otherwise look alike)
    assert "Tables the attacks declare: <code>noise-sweep_by_scale</code>" in page.read_text()
    assert "at each noise scale" in page.read_text()
    specs = [json.loads(p.read_text()) for p in store.glob("*/spec.json")]
    key = next(s["detector"]["key_from"] for s in specs if s["detector"]["method"] == "untrained-kgw")
    out = run("detect", "--results", str(store), "--key", key, "--model", settings["base_model"], "--json")
    decision = json.loads(out.stdout)["decision"]
    assert not decision["watermarked"] and decision["p_value"] > 0.01, decision  # its key on the model it left alone
