"""``harness export``: a store's runs and attribution results copied without their texts still verify, and
``harness tables`` and ``harness report`` read the copy as they read the store; what does not verify is left out
and named; an exported run cannot be rescored (its texts are gone), one line."""

from __future__ import annotations

import json

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
