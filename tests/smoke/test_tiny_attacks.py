"""Every attack of the paper end to end on the tiny preset, through the installed CLI, in the smoke tests' shared store
(one cell per attack plugin; the Gu-KGW student trained once for every smoke test): each attacked row lies between the
unwatermarked base and the unaltered model, 8-bit quantization barely moves the AUC, and ``harness tables`` puts every
row into one table. The model attacks run as one ``harness grid`` (one process: the models load once, as in a user's
grid); a failed cell is reported by the grid and fails that attack's test alone."""

import json

import pytest

pytestmark = pytest.mark.smoke

CELLS = {  # attack -> its settings over the tiny preset's
    "gptq": {"bits": 8},
    "int8": {},
    "hqq": {},
    "gguf": {"type": "Q4_0"},
    "wanda": {"sparsity": 0.5},
    "sparsegpt": {"sparsity": 0.2},
    "slerp": {"t": 0.5},  # (also another smoke file's cell: the shared store reuses it, whichever asks first)
    "finetune": {"steps": "9,45"},
    "dipper": {},
}
EIGHT_BITS = {"gptq", "int8"}
EVALUATED = {  # what each attack's report says its evaluated folder holds
    "gptq": "dequantized by gptqmodel",
    "int8": "Linear8bitLt layers",
    "hqq": "dequantized by hqq",
    "gguf": "Q4_0 GGUF file loaded back by transformers' GGUF loader",
    "wanda": "the pruned model",
    "sparsegpt": "the pruned model",
    "slerp": "the merged model",
    "finetune": "the fine-tuned model",
}
# DIPPER's cell first builds the tiny paraphraser (about an hour on 2 cores): slow, and run alone. Its code path is
# tested on a random T5.
SLOW = {"dipper"}
PARAMS = [pytest.param(a, marks=pytest.mark.slow) if a in SLOW else a for a in CELLS]


@pytest.fixture(scope="module")
def grid_output(shared_store, harness, tmp_path_factory):
    """Every attack but the slow ones as one grid in the shared store; its stdout (which lists the failed cells)."""
    root = shared_store
    attacks = "".join(f"      {a}: [{json.dumps(settings)}]\n" for a, settings in CELLS.items() if a not in SLOW)
    spec = tmp_path_factory.mktemp("attacks") / "attacks.yaml"
    spec.write_text(f"preset: tiny\ngroups:\n  attacks:\n    methods:\n      gu-kgw: [{{}}]\n    attacks:\n{attacks}")
    # (the timeout allows for the Gu-KGW student too: this grid trains it when it is the first of the smoke tests to
    # ask for it)
    out = harness("grid", str(spec), "--results", str(root), timeout=3600)
    assert out.returncode in (0, 1), out.stderr[-3000:]  # 1: some cell failed (its attack's test says which)
    return out.stdout


@pytest.mark.parametrize("attack", PARAMS)
def test_attacked_rows_lie_between_base_and_unaltered(attack, shared_store, harness, runs_by_row, request):
    root = shared_store
    if attack in SLOW:
        args = [a for k, v in CELLS[attack].items() for a in ("--attack-arg", f"{k}={v}")]
        out = harness("run", "--method", "gu-kgw", "--attack", attack, *args, "--results", str(root), timeout=5400)
        assert out.returncode == 0, out.stderr[-3000:]
    else:
        failed = [line for line in request.getfixturevalue("grid_output").splitlines() if line.startswith("  failed:")]
        assert not [line for line in failed if f" x {attack}(" in line], failed
    rows = runs_by_row(root, attack)
    base, unaltered = rows["Unwatermarked base"][1], rows["Unaltered"][1]
    attacked = {row: m for row, (spec, m) in rows.items() if spec["config"]["attack"]["name"] == attack}
    assert len(attacked) == (2 if attack == "finetune" else 1), sorted(rows)
    for row, m in attacked.items():
        assert base["auc"] - 0.05 < m["auc"] <= unaltered["auc_ci95"][1] + 1e-9, (row, m["auc"], base, unaltered)
        if attack in EIGHT_BITS:
            assert abs(m["auc"] - unaltered["auc"]) < 0.05, (row, m["auc"], unaltered["auc"])
        run = next(
            p.parent for p in root.glob("*/DONE") if json.loads((p.parent / "spec.json").read_text())["row"] == row
        )
        manifest = json.loads((run / "manifest.json").read_text())
        if attack != "dipper":
            assert EVALUATED[attack] in manifest["report"]["evaluated"], manifest  # e.g. a dequantized copy
        else:
            para = m["paraphrase"]
            assert 0 < para["mean_unigram_overlap"] < 0.95 and para["mean_embedding_cosine"] > 0.3, para


def test_tables_hold_every_attack(shared_store, grid_output, cli, tmp_path):
    root = shared_store
    out = cli("tables", "--results", str(root), "--out", str(tmp_path))
    assert out.returncode == 0, out.stderr
    csv = (tmp_path / "tiny" / "robustness.csv").read_text()
    for label in ("GPTQ", "INT8", "HQQ", "Wanda", "SparseGPT", "SLERP", "StdlibCodeInstruct"):
        assert label in csv, (label, csv)
    rows = {tuple(line.split(",")[:3]) for line in csv.splitlines()}
    expected = [
        ("Quantization", "GPTQ", "8 bits"), ("Quantization", "INT8", "8 bits"), ("Quantization", "HQQ", "4 bits"),
        ("Quantization", "GGUF", "Q4_0"), ("Pruning", "Wanda", "rho=0.5"), ("Pruning", "SparseGPT", "rho=0.2"),
        ("Merging", "SLERP", "t=0.5"),
        ("Finetuning", "StdlibCodeInstruct", "s=9"), ("Finetuning", "StdlibCodeInstruct", "s=45"),
    ]  # fmt: skip
    for row in expected:
        assert row in rows, (row, csv)
