"""Run store: hashes cover the spec, folders appear only when finished, and finished work is reused."""

import json

import pytest

from harness.config.errors import HarnessError
from harness.store.stages import Store, spec_hash


def test_hash_ignores_key_order_but_not_values():
    assert spec_hash({"a": 1, "b": {"c": 2}}) == spec_hash({"b": {"c": 2}, "a": 1})
    assert spec_hash({"a": 1}) != spec_hash({"a": 2})
    assert spec_hash({"a": [1, 2]}) != spec_hash({"a": [2, 1]})


def test_stage_folders(tmp_path):
    store = Store(tmp_path)
    assert store.stage("run", {"x": 1}).path.parent == tmp_path
    assert store.stage("train", {"x": 1}).path.parent == tmp_path / "stages" / "train"


def test_build_publishes_spec_manifest_and_done(tmp_path):
    stage = Store(tmp_path).stage("train", {"x": 1})
    stage.build(lambda out: (out / "result.txt").write_text("ok") and {"measured": 3})
    assert stage.done
    assert json.loads((stage.path / "spec.json").read_text()) == {"x": 1}
    manifest = stage.manifest()
    assert manifest["hash"] == stage.key and manifest["report"] == {"measured": 3}
    assert manifest["versions"]["torch"]
    # The processor, torch's kernel level and threads: each changes a trained model's bits (AVX2 against AVX-512).
    import torch

    assert manifest["machine"]["cpu"]
    assert manifest["machine"]["torch_cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert manifest["machine"]["torch_threads"] == torch.get_num_threads()
    assert (stage.path / "result.txt").read_text() == "ok"


def test_crash_leaves_nothing_that_looks_finished(tmp_path):
    stage = Store(tmp_path).stage("run", {"x": 2})

    def crash(out):
        (out / "half.jsonl").write_text("{}")
        raise RuntimeError("killed")

    with pytest.raises(RuntimeError):
        stage.build(crash)
    assert not stage.path.exists()
    assert list(tmp_path.iterdir()) == []
    assert Store(tmp_path).runs() == []


def test_runs_lists_only_finished_runs(tmp_path):
    store = Store(tmp_path)
    store.stage("run", {"x": 1}).build(lambda out: {})
    store.stage("train", {"x": 1}).build(lambda out: {})
    (tmp_path / "deadbeef").mkdir()  # unfinished
    assert [p.name for p in store.runs()] == [store.stage("run", {"x": 1}).key]


def test_unwritable_results_folder_is_one_clear_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(HarnessError, match="not writable"):
        Store(blocker / "runs").check_writable()


def test_a_dry_runs_check_of_a_read_only_folder_makes_nothing(tmp_path, monkeypatch):
    """``create=False`` (a dry run) asks the nearest folder that exists whether this process may write in it (a
    read-only mount answers no, for root too) and makes nothing; the run's own check makes the folder."""
    import os

    target = tmp_path / "a" / "b"
    Store(target).check_writable(create=False)
    assert not (tmp_path / "a").exists()
    asked = []
    monkeypatch.setattr(os, "access", lambda path, mode: asked.append(path) or False)
    with pytest.raises(HarnessError, match=f"not writable: '{tmp_path}' is not writable by this process"):
        Store(target).check_writable(create=False)
    assert asked == [tmp_path] and not (tmp_path / "a").exists()


def test_the_manifest_names_the_commit_from_before_the_build(tmp_path, monkeypatch):
    """A long build (a training) may outlast a commit: the manifest keeps the commit the build started from."""
    from harness.store import stages

    commits = iter(["before", "after"])
    monkeypatch.setattr(stages, "git_sha", lambda: next(commits))
    stage = Store(tmp_path).stage("train", {"x": 1})
    stage.build(lambda out: {"commit during the build": stages.git_sha()})
    manifest = json.loads((stage.path / "manifest.json").read_text())
    assert manifest["git_sha"] == "before" and manifest["report"] == {"commit during the build": "after"}


def test_a_renamed_or_linked_stage_is_not_read_as_its_name(tmp_path):
    """A stage is the folder its spec hashes to, inside its store: one renamed (its contents still verify) or a link
    to a folder elsewhere is told apart with the reason, and tables, reports and exports leave it out."""
    store = Store(tmp_path / "runs")
    stage = store.stage("run", {"x": 1})
    stage.build(lambda out: (out / "spec.json").write_text(json.dumps({"x": 1})) and {})
    assert stage.problem() is None
    renamed = store.root / "bbbbbbbbbbbbbbbb"
    stage.path.rename(renamed)
    assert "hashes to" in store.at("run", renamed.name).problem()
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    renamed.rename(outside / stage.key)
    (store.root / stage.key).symlink_to(outside / stage.key)
    assert "not a folder of the store's own" in store.at("run", stage.key).problem()


@pytest.mark.parametrize("where", ["stages", "stages/train", ".locks"])
def test_a_file_where_the_store_keeps_a_folder_is_one_line(tmp_path, where):
    store = Store(tmp_path / "runs")
    (store.root / where).parent.mkdir(parents=True, exist_ok=True)
    (store.root / where).write_text("x")
    with pytest.raises(HarnessError, match=f"is damaged: '{store.root / where}' is a file where it keeps a folder"):
        store.check_writable()
