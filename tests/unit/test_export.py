"""``harness export``: a store's runs and attribution results copied without their texts still verify, and
``harness tables`` and ``harness report`` read the copy as they read the store; what does not verify is left out
and named; an exported run cannot be rescored (its texts are gone), one line."""

from __future__ import annotations

import json
import shutil
import signal
import socket
import subprocess
import sys

import pytest

from harness.store.stages import Store


@pytest.fixture
def store(two_method_store, fake_run):
    store = two_method_store
    fake_run(store, "gu-kgw", {}, "dipper", {"lexical": 60, "order": 0}, 0.8)  # a text attack: its metrics read texts
    return store


def tree(folder) -> dict:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_export_leaves_out_texts_and_tables_are_identical(store, cli, tmp_path, caplog):
    dest = tmp_path / "exported"
    out = cli("export", str(dest), "--results", str(store.root))
    assert out.returncode == 0, out.stderr
    runs = store.runs()
    assert "exported 7 runs" in out.stdout
    for run in runs:
        copy = dest / run.name
        assert (copy / "DONE").exists() and not (copy / "generations.jsonl").exists()
        for name in ("spec.json", "scores.jsonl", "metrics.json"):
            assert (copy / name).read_bytes() == (run / name).read_bytes(), name
        assert json.loads((copy / "manifest.json").read_text())["exported_without"] == ["generations.jsonl"]
        assert Store(dest).stage("run", json.loads((copy / "spec.json").read_text())).problem() is None

    for root, folder in ((store.root, "from-store"), (dest, "from-export")):
        made = cli("tables", "--results", str(root), "--out", str(tmp_path / folder), "--ci", "--no-figures")
        assert made.returncode == 0, made.stderr
    assert tree(tmp_path / "from-store") == tree(tmp_path / "from-export")
    assert cli("report", "--results", str(dest), "--out", str(tmp_path / "r.html")).returncode == 0

    # Up-to-date metrics: nothing to rescore. Stale ones cannot be recomputed without the texts: one line, exit 2.
    assert cli("rescore", "--results", str(dest)).returncode == 0
    metrics = dest / runs[-1].name / "metrics.json"
    metrics.write_text(json.dumps({**json.loads(metrics.read_text()), "metrics_version": "0"}))
    with caplog.at_level("WARNING"):
        out = cli("rescore", "--results", str(dest))
    assert out.returncode == 2 and runs[-1].name in out.stderr and len(out.stderr.strip().splitlines()) == 1
    assert "exported without generations.jsonl" in caplog.text


def test_export_keeps_texts_when_asked_and_leaves_out_what_does_not_verify(store, cli, tmp_path):
    runs = store.runs()
    (runs[0] / "scores.jsonl").write_text("{")  # damaged: truncated JSON lines
    out = cli("export", str(tmp_path / "kept"), "--results", str(store.root), "--keep-texts")
    assert out.returncode == 2
    assert str(runs[0]) in out.stderr
    assert not (tmp_path / "kept" / runs[0].name).exists()
    for run in runs[1:]:
        copy = tmp_path / "kept" / run.name
        assert (copy / "generations.jsonl").read_bytes() == (run / "generations.jsonl").read_bytes()
        assert "exported_without" not in json.loads((copy / "manifest.json").read_text())


def test_bad_export_inputs(cli, store, tmp_path):
    missing = cli("export", str(tmp_path / "x"), "--results", str(tmp_path / "nowhere"))
    assert missing.returncode == 2 and "no run store" in missing.stderr
    into_itself = cli("export", str(store.root), "--results", str(store.root))
    assert into_itself.returncode == 2 and "into itself" in into_itself.stderr
    (tmp_path / "afile").write_text("")
    onto_file = cli("export", str(tmp_path / "afile"), "--results", str(store.root))
    assert onto_file.returncode == 2 and len(onto_file.stderr.strip().splitlines()) == 1
    documents = tmp_path / "documents"  # (a folder of the user's, not a store: nothing is merged into it)
    documents.mkdir()
    (documents / "notes.txt").write_text("mine")
    into_other = cli("export", str(documents), "--results", str(store.root))
    assert into_other.returncode == 2 and "neither empty nor a run store" in into_other.stderr
    assert [p.name for p in documents.iterdir()] == ["notes.txt"]


def test_an_export_killed_midway_leaves_nothing_read_as_a_run(store, cli, tmp_path):
    """A kill mid-copy (SIGKILL: no clean-up runs) leaves a temporary folder that is never read as a run, even one
    holding a whole verified copy with its DONE (what earlier exports left), and the next export removes it."""
    dest = tmp_path / "exported"
    killed = subprocess.run(
        [sys.executable, "-c", KILLED_EXPORT, str(store.root), str(dest)], capture_output=True, text=True, timeout=120
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    (leftover,) = [p for p in dest.iterdir() if ".partial-" in p.name]
    assert not (leftover / "DONE").exists()  # DONE is written last
    # What an export of earlier code left: a complete copy, DONE and all, under the temporary name of a dead process.
    old = dest / f".{store.runs()[0].name}.partial-{socket.gethostname()}-{2**22 + 7}"
    shutil.copytree(store.runs()[0], old)
    assert Store(dest).runs() == [] and Store(dest).results() == []
    made = cli("tables", "--results", str(dest), "--out", str(tmp_path / "t"), "--no-figures")
    assert made.returncode == 2 and "no finished runs" in made.stderr.lower(), made.stderr

    again = cli("export", str(dest), "--results", str(store.root))
    assert again.returncode == 0, again.stderr
    assert not [p for p in dest.iterdir() if ".partial-" in p.name]
    assert sorted(p.name for p in Store(dest).runs()) == sorted(p.name for p in store.runs())


KILLED_EXPORT = """
import os, shutil, signal, sys
from pathlib import Path
from harness.store import export
from harness.store.stages import Store

copytree = shutil.copytree
def copy_then_die(src, dst, **kw):
    copytree(src, dst, **kw)
    os.kill(os.getpid(), signal.SIGKILL)
export.shutil.copytree = copy_then_die
export.export(Store(Path(sys.argv[1])), Path(sys.argv[2]))
"""


def test_two_exports_into_one_folder_at_once(store, cli, tmp_path):
    """While one export writes into a folder, a second is refused in one line (exit 2) and changes nothing; two
    processes started at once end with every run exported and nothing half-copied."""
    from harness.store import files

    dest = tmp_path / "exported"
    (dest / ".locks").mkdir(parents=True)
    held = files.try_lock(dest / ".locks" / "export.lock")  # (flock: another open of it is refused, in-process too)
    try:
        second = cli("export", str(dest), "--results", str(store.root))
    finally:
        held.release()
    assert second.returncode == 2 and len(second.stderr.strip().splitlines()) == 1
    assert "another 'harness export'" in second.stderr and not Store(dest).runs()

    both = [
        subprocess.Popen(
            [sys.executable, "-m", "harness", "export", str(dest), "--results", str(store.root)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    for proc in both:
        _, err = proc.communicate(timeout=120)
        assert proc.returncode in (0, 2), err
        assert "Traceback" not in err and (proc.returncode == 0 or len(err.strip().splitlines()) == 1), err
    assert 0 in [p.returncode for p in both]
    assert not [p for p in dest.iterdir() if ".partial-" in p.name]
    assert sorted(p.name for p in Store(dest).runs()) == sorted(p.name for p in store.runs())
    assert all(Store(dest).at("run", p.name).problem() is None for p in Store(dest).runs())


def test_export_of_a_grid_copies_its_runs_alone(random_llamas, tmp_path, small_preset, cli):
    """``--grid``: the runs the grid's cells make in the store, and no other run of the store; the count says so."""
    from harness.cell.pipeline import Pipeline
    from harness.config.registry import attacks, methods

    base, _ = random_llamas
    settings = {"train.steps": "2", "train.batch_size": "2", "train.seq_len": "12", "eval.num_prompts": "4",
                "eval.prompt_tokens": "4", "eval.new_tokens": "8", "eval.batch_size": "2"}  # fmt: skip
    preset = small_preset(tmp_path, base, **settings)
    store = Store(tmp_path / "runs")
    pipe = Pipeline(preset, store, "cpu")
    kept = {c.run.key for c in pipe.run(methods.build("gu-kgw", {}), attacks.build("none", {}))}
    other = {c.run.key for c in pipe.run(methods.build("gu-kgw", {}), attacks.build("weight-noise", {}))} - kept
    overrides = {"base_model": str(base), "oracle_model": str(base), "train_data.path": str(tmp_path / "corpus.jsonl"),
                 "eval_data.path": str(tmp_path / "corpus.jsonl"), **settings}  # fmt: skip
    spec = tmp_path / "grid.yaml"
    groups = {"g": {"methods": {"gu-kgw": [{}]}, "attacks": {"none": [{}]}}}
    spec.write_text(json.dumps({"preset": "tiny", "overrides": overrides, "groups": groups}))
    out = cli("export", "--grid", str(spec), "--results", str(store.root), str(tmp_path / "out"))
    assert out.returncode == 0, out.stderr
    copied = {p.parent.name for p in (tmp_path / "out").glob("*/DONE")}
    assert copied == kept and len(kept) == 2 and other and not copied & other
    assert "exported 2 runs" in out.stdout


def test_export_of_a_calibrated_grid_copies_its_sweep_choice_and_cells(random_llamas, tmp_path, small_preset, cli):
    """``--grid`` with a calibration section: before the choice is stored, the sweep's stored runs alone (the count
    names the rest); once the grid has run, its sweep's runs, its calibration stage and its chosen cells' runs, and
    no other run of the store."""
    from harness.cell.pipeline import Pipeline
    from harness.config.registry import attacks, methods
    from harness.grid import spec as grid
    from harness.store import kinds

    base, _ = random_llamas
    settings = {"eval.num_prompts": "3", "eval.prompt_tokens": "4", "eval.new_tokens": "6", "eval.batch_size": "3",
                "quality_gate.ppl_ratio": "[0.01, 100]", "quality_gate.rep3_floor": "0.99"}  # fmt: skip
    small_preset(tmp_path, base)  # (writes the corpus)
    overrides = {"base_model": str(base), "oracle_model": str(base), "train_data.path": str(tmp_path / "corpus.jsonl"),
                 "eval_data.path": str(tmp_path / "corpus.jsonl"), **settings}  # fmt: skip
    spec = tmp_path / "grid.yaml"
    spec.write_text(json.dumps({
        "preset": "tiny", "overrides": overrides,
        "calibration": {"ppl_ratio_max": 50, "sweep": {"kgw-decoding": {"delta": [1, 4]}}},
        "groups": {"matched": {"methods": {"kgw-decoding": ["calibrated"]}, "attacks": {"lowercase": [{}]}}},
    }))  # fmt: skip
    g = grid.load(spec)
    store = Store(tmp_path / "runs")
    pipe = Pipeline(g.sweep[0].preset, store, "cpu")
    first = {c.run.key for c in pipe.run(*g.sweep[0].build())}
    other = {c.run.key for c in pipe.run(methods.build("kgw-decoding", {"delta": 2}), attacks.build("none", {}))}
    other -= first

    def exported(folder) -> tuple[set[str], str]:
        out = cli("export", "--grid", str(spec), "--results", str(store.root), str(tmp_path / folder))
        assert out.returncode == 0, out.stderr
        return {stage.key for stage in Store(tmp_path / folder).finished()}, out.stdout

    copied, said = exported("partial")  # one sweep cell of two stored: no choice yet
    assert copied == first and len(first) == 2 and other
    assert "exported 2 runs" in said and "! 2 of the grid's 4 runs are not stored" in said

    assert cli("grid", str(spec), "--results", str(store.root)).returncode == 0
    calibrations = {s.key for s in store.finished() if s.kind == kinds.CALIBRATION}
    stored = {p.name for p in store.runs()} | calibrations
    copied, said = exported("whole")
    assert copied == stored - other and first < copied and len(calibrations) == 1 and calibrations < copied
    assert f"exported {len(copied)} runs" in said and "not stored" not in said
