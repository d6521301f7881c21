"""A grid with a calibration end to end on a random 2-layer Llama: the sweep's unaltered cells run first, the rule
picks each method's configuration and stores the choice with the whole sweep, the ``calibrated`` entries then run
that configuration, a second run chooses the same from the store, and ``harness tables`` writes the tables at
matched quality beside the others."""

import json

from harness.grid import calibration
from harness.grid import spec as grid

SPEC = """\
preset: tiny
overrides:
  base_model: {base}
  oracle_model: {base}
  train_data.path: {corpus}
  eval_data.path: {corpus}
  eval.num_prompts: 6
  eval.prompt_tokens: 4
  eval.new_tokens: 8
  eval.batch_size: 3
  quality_gate.ppl_ratio: {gate}
  quality_gate.rep3_floor: 0.99
calibration:
  ppl_ratio_max: {budget}
  sweep:
    kgw-decoding: {{delta: [1, 4, 8]}}
groups:
  matched:
    methods: {{kgw-decoding: [calibrated]}}
    attacks: {{none: [{{}}], lowercase: [{{}}]}}
"""


def write(folder, random_llamas, budget, gate="[0.01, 100]"):
    """The spec, with a gate wide enough for a random model's texts (the mechanics, not their quality) by default."""
    corpus = folder / "corpus.jsonl"
    texts = ["The quick brown fox jumps over the lazy dog and runs into the forest to find more food."] * 12
    corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    path = folder / f"grid-{budget}.yaml"
    path.write_text(SPEC.format(base=random_llamas[1], corpus=corpus, budget=budget, gate=gate))
    return path


def test_the_calibration_runs_first_chooses_by_its_rule_and_keeps_its_choice(tmp_path, random_llamas, cli):
    path, root = write(tmp_path, random_llamas, 50), tmp_path / "runs"
    first = cli("grid", str(path), "--results", str(root))
    assert first.returncode == 0, first.stderr[-3000:]
    g = grid.load(path)
    (stage,) = calibration.stages(g, root, build=False).values()
    found = json.loads((stage.path / calibration.FILE).read_text())
    assert [r["value"] for r in found["sweep"]] == [1.0, 4.0, 8.0] and found["setting"] == "delta"
    best = max(found["sweep"], key=lambda r: r["AUC_vs_base"])  # every value is inside this budget and gate
    assert found["chosen"]["value"] == best["value"] and f"kgw-decoding: chose delta={best['value']}" in first.stdout
    assert "2 cells: 1 reused, 1 computed" in first.stdout  # the chosen unaltered cell is a sweep cell

    again = cli("grid", str(path), "--results", str(root))
    assert again.returncode == 0 and "2 cells: 2 reused" in again.stdout
    assert calibration.stages(g, root, build=False)[g.sweep[0].method].key == stage.key  # the same stored choice
    dry = cli("grid", str(path), "--results", str(root), "--dry-run")
    assert f"the calibration chose kgw-decoding: k=1, delta={best['value']:g}" in dry.stdout

    assert cli("tables", "--results", str(root), "--out", str(tmp_path / "tables"), "--no-figures").returncode == 0
    matched = (tmp_path / "tables" / "tiny" / "matched.csv").read_text()
    assert matched.splitlines()[3].startswith("Unaltered,") and "At matched quality" in (
        tmp_path / "tables" / "tiny" / "matched.tex").read_text()  # fmt: skip


def test_a_budget_no_swept_value_meets_is_one_line_naming_the_closest(tmp_path, random_llamas, cli):
    # A gate that only texts of the base's very perplexity pass: no watermarked configuration does.
    path = write(tmp_path, random_llamas, 1, gate="[0.999999, 1.000001]")
    out = cli("grid", str(path), "--results", str(tmp_path / "runs"))
    last = out.stderr.strip().splitlines()[-1]
    assert out.returncode == 2 and "no swept delta of kgw-decoding meets" in last and "the closest, delta=" in last


def test_a_grid_run_group_by_group_exports_and_dry_runs_the_groups_it_finished(tmp_path, random_llamas, cli):
    """As on a GPU lease that finishes some groups: the finished method's choice and attacked cells count as the
    grid's (``export --grid`` copies them, a dry run lists them) while the other method still waits for its sweep."""
    path, root = write(tmp_path, random_llamas, 50), tmp_path / "runs"
    swept = "    kgw-decoding: {delta: [1, 4, 8]}\n"
    text = path.read_text().replace(swept, swept + "    aar-decoding: {k: [1, 2]}\n")
    path.write_text(text + "  later:\n    methods: {aar-decoding: [calibrated]}\n    attacks: {none: [{}]}\n")
    first = cli("grid", str(path), "--group", "matched", "--results", str(root))
    assert first.returncode == 0, first.stderr[-3000:]

    dry = cli("grid", str(path), "--results", str(root), "--dry-run")
    assert dry.returncode == 0 and "the calibration chose kgw-decoding: " in dry.stdout
    assert "not chosen yet: later: aar-decoding" in dry.stdout
    everything = cli("export", "--results", str(root), str(tmp_path / "all"))
    of_grid = cli("export", "--grid", str(path), "--results", str(root), str(tmp_path / "grid"))
    copied = [int(out.stdout.split("exported ")[1].split()[0]) for out in (everything, of_grid)]
    assert copied[0] == copied[1] > 7  # the sweep's runs, the choice, and the attacked cell's run
    assert "of the grid's" in of_grid.stdout  # the other method's sweep, named as not stored


def test_a_calibrated_entry_an_attack_cannot_take_is_refused_before_the_sweep(tmp_path, random_llamas, cli):
    """The choice's cells are checked at the first swept value before any sweep cell runs: a decoding-time watermark
    under a model attack is one line (exit 2), not an error once the sweep's trainings are done."""
    path, root = write(tmp_path, random_llamas, 50), tmp_path / "runs"
    text = path.read_text().replace("lowercase: [{}]", "weight-noise: [{}]")
    path.write_text(text)
    entry = 1 + text.splitlines().index("    methods: {kgw-decoding: [calibrated]}")  # the line the error names
    for args in (["--dry-run"], []):
        out = cli("grid", str(path), "--results", str(root), *args)
        last = out.stderr.strip().splitlines()[-1]
        assert out.returncode == 2 and "model attacks (weight-noise) do not apply" in last and f":{entry} (" in last
    assert not any((root / "stages").glob("generate/*"))  # no sweep cell ran
