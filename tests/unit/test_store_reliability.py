"""The store never hands out a wrong number: damaged stages are set aside and rebuilt, edited ones refused, partial
folders of dead processes swept, and two processes needing one stage build it once."""

import json
import os
import signal
import subprocess
import sys

import pytest

from harness.store.stages import EditedStage, Store


def build_key(out, gamma=0.25):
    import torch
    from safetensors.torch import save_file

    (out / "key.json").write_text(json.dumps({"gamma": gamma}))
    (out / "model").mkdir()
    save_file({"w": torch.arange(512, dtype=torch.float32)}, out / "model" / "model.safetensors")
    (out / "notes.bin").write_bytes(b"\1" * 64)
    return {"built": True}


def reuse(store, stage, calls):
    return store.build_or_reuse(stage, "test stage", lambda out: calls.append(1) or build_key(out))


def test_published_stage_lists_every_file_with_its_hash(tmp_path):
    store = Store(tmp_path)
    stage = store.stage("train", {"x": 1})
    calls = []
    assert reuse(store, stage, calls) is False
    contents = json.loads((stage.path / "contents.json").read_text())
    assert {"key.json", "model/model.safetensors", "spec.json", "manifest.json"} <= set(contents)
    assert all(len(v["sha256"]) == 64 and v["size"] > 0 for v in contents.values())
    assert reuse(store, stage, calls) is True and len(calls) == 1


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (lambda p: (p / "model" / "model.safetensors").unlink(), "missing"),
        (lambda p: (p / "key.json").write_text('{"gam'), "not valid json"),  # truncated
        (lambda p: (p / "model" / "model.safetensors").write_bytes(b"\0" * 100), "not valid safetensors"),
        (lambda p: truncate(p / "model" / "model.safetensors", 1000), "not valid safetensors"),
        (lambda p: (p / "notes.bin").write_bytes(b"\1" * 10), "its size changed"),
        (lambda p: (p / "contents.json").write_text("{"), "contents.json is damaged"),
        (lambda p: (p / "contents.json").unlink(), "contents.json is missing"),
    ],
)
def test_damaged_stage_is_set_aside_and_rebuilt(tmp_path, caplog, damage, reason):
    store = Store(tmp_path)
    stage = store.stage("train", {"x": 1})
    calls = []
    reuse(store, stage, calls)
    damage(stage.path)
    assert reuse(store, stage, calls) is False and len(calls) == 2
    assert reason in caplog.text and stage.key in caplog.text
    assert stage.problem() is None
    aside = list((tmp_path / "damaged").iterdir())
    assert len(aside) == 1 and aside[0].name.startswith(f"stages-train-{stage.key}")  # nothing deleted


def truncate(file, size):
    file.write_bytes(file.read_bytes()[:size])


def edit_safetensors(folder):
    import torch
    from safetensors.torch import save_file

    save_file({"w": torch.arange(512, dtype=torch.float32) + 1}, folder / "model" / "model.safetensors")


@pytest.mark.parametrize(
    ("edit", "name"),
    [
        (lambda p: (p / "key.json").write_text(json.dumps({"gamma": 0.5})), "key.json"),  # 0.25 -> 0.5: shorter
        (lambda p: (p / "key.json").write_text(json.dumps({"gamma": 0.35})), "key.json"),  # same size
        (edit_safetensors, "model.safetensors"),
        (lambda p: (p / "notes.bin").write_bytes(b"\2" * 64), "notes.bin"),
    ],
)
def test_edited_artefact_is_refused_naming_the_file(tmp_path, edit, name):
    store = Store(tmp_path)
    stage = store.stage("train", {"x": 1})
    calls = []
    reuse(store, stage, calls)
    edit(stage.path)
    before = (stage.path / "key.json").read_bytes()
    with pytest.raises(EditedStage, match=rf"{name} was changed after"):
        reuse(store, stage, calls)
    assert len(calls) == 1 and (stage.path / "key.json").read_bytes() == before  # nothing rebuilt or replaced


SLOW_BUILD = """
import os, sys, time
from harness.store.stages import Store
store = Store(sys.argv[1])
def build(out):
    with open(sys.argv[2], "a") as fh:
        fh.write(f"{os.getpid()}\\n")
    time.sleep(1.5)
    (out / "generations.jsonl").write_text("{}")
    return {}
store.build_or_reuse(store.stage("generate", {"same": "stage"}), "generation", build)
"""


def test_two_processes_build_one_stage_once(tmp_path):
    marker = tmp_path / "builders.txt"
    args = [sys.executable, "-c", SLOW_BUILD, str(tmp_path / "runs"), str(marker)]
    procs = [subprocess.Popen(args) for _ in range(2)]
    assert [p.wait(60) for p in procs] == [0, 0]
    assert len(marker.read_text().split()) == 1  # the second waited, then reused


KILLED_BUILD = """
import sys, time
from harness.store.stages import Store
store = Store(sys.argv[1])
def build(out):
    (out / "half.bin").write_bytes(b"x" * 100)
    print("building", flush=True)
    time.sleep(60)
    return {}
store.build_or_reuse(store.stage("train", {"k": 1}), "training", build)
"""


def test_sigkill_leaves_a_partial_that_the_next_run_sweeps(tmp_path):
    root = tmp_path / "runs"
    proc = subprocess.Popen([sys.executable, "-c", KILLED_BUILD, str(root)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "building"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(10)
    partials = list((root / "stages" / "train").glob(".*.partial-*"))
    assert len(partials) == 1  # what a SIGKILL leaves
    store = Store(root)
    assert store.sweep() == 1
    assert not list((root / "stages" / "train").glob(".*.partial-*"))
    stage = store.stage("train", {"k": 1})
    assert store.build_or_reuse(stage, "training", build_key) is False and stage.problem() is None


def test_sweep_keeps_the_partial_of_a_live_build(tmp_path):
    from filelock import FileLock

    store = Store(tmp_path)
    stage = store.stage("train", {"k": 2})
    partial = stage.path.with_name(f".{stage.key}.partial-otherhost-1")
    partial.mkdir(parents=True)
    stage.lock_file.parent.mkdir(parents=True, exist_ok=True)
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"from filelock import FileLock; l = FileLock({str(stage.lock_file)!r}); "
            "l.acquire(); print('held', flush=True); import time; time.sleep(30)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        assert store.sweep() == 0 and partial.exists()
    finally:
        holder.kill()
        holder.wait()
    assert FileLock(str(stage.lock_file)).acquire(timeout=5)
    assert store.sweep() == 1 and not partial.exists()


def test_tables_skip_a_damaged_run_and_write_the_rest(tmp_path, caplog, fake_run):
    from harness.report.collect import collect
    from harness.report.tables import write_tables

    store = Store(tmp_path / "runs")
    runs = [
        fake_run(store, "gu-kgw", {}, "none", {}, 0.99),
        fake_run(store, "gu-kgw", {}, "slerp", {"t": 0.5}, 0.75),
        fake_run(store, "gu-kgw", {}, "slerp", {"t": 0.3}, 0.85),
    ]
    metrics = runs[1] / "metrics.json"
    metrics.write_text(metrics.read_text()[:20])  # truncated
    edited = runs[2] / "metrics.json"
    text = edited.read_text()
    edited.write_text(text.replace('"auc": 0.', '"auc": 1.', 1))  # same size, other number
    assert edited.read_text() != text
    df = collect(store)
    assert list(df["category"]) == ["Unaltered"]
    assert str(runs[1]) in caplog.text and str(runs[2]) in caplog.text
    assert write_tables(df, tmp_path / "tables")


def test_an_unfinished_stage_folder_is_set_aside_with_what_it_holds(tmp_path):
    """A stage folder with no DONE (a build that never finished, or files a user put there) is moved to damaged/
    whole when the stage is built, never deleted."""
    store = Store(tmp_path)
    stage = store.stage("train", {"x": 2})
    stage.path.mkdir(parents=True)
    (stage.path / "my-notes.txt").write_text("keep me")
    assert reuse(store, stage, []) is False and stage.done
    (kept,) = (tmp_path / "damaged").iterdir()
    assert (kept / "my-notes.txt").read_text() == "keep me" and kept.name.startswith(f"stages-train-{stage.key}-")


def test_a_damaged_stage_that_cannot_be_moved_is_one_line(tmp_path, monkeypatch):
    from pathlib import Path

    from harness.config.errors import HarnessError

    store = Store(tmp_path)
    stage = store.stage("train", {"x": 3})
    reuse(store, stage, [])
    (stage.path / "key.json").unlink()  # damaged: a file it published is missing

    def refuse(self, target):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(Path, "rename", refuse)  # as a read-only store would (root writes even there)
    with pytest.raises(HarnessError, match=r"must be set aside .* cannot be moved to .*damaged: Permission denied"):
        reuse(store, stage, [])


@pytest.mark.parametrize("kind", ["symlink", "file", "symlink inside"])
def test_a_damaged_folder_that_is_not_the_stores_own_is_refused(tmp_path, kind):
    """damaged/ as a symbolic link (even to a folder of the store) or a file: a damaged stage is never moved through it
    (a link to elsewhere moved runs out of the store), it stays where it is, and the one line says what to do."""
    from harness.config.errors import HarnessError

    root, outside = tmp_path / "runs", tmp_path / "outside"
    outside.mkdir()
    store = Store(root)
    stage = store.stage("train", {"x": 5})
    reuse(store, stage, [])
    (stage.path / "key.json").unlink()  # damaged
    if kind == "file":
        (root / "damaged").write_text("")
    else:
        target = outside if kind == "symlink" else root / "stages"
        (root / "damaged").symlink_to(target, target_is_directory=True)
    with pytest.raises(HarnessError, match=r"must be set aside .* is (a symbolic link|not a folder of the store)"):
        reuse(store, stage, [])
    assert not any(outside.iterdir()) and stage.path.is_dir() and len(list((root / "stages" / "train").iterdir())) == 1


@pytest.mark.parametrize(
    "listing, problem",
    [
        ({"../../outside.txt": {"size": 1, "sha256": "0"}}, "contents.json names a file outside its stage (../../"),
        (["key.json"], "contents.json is damaged"),
        ({"key.json": None}, "contents.json is damaged (its entry for key.json is null)"),  # (a TypeError before)
        ({"key.json": {"size": 2}}, "contents.json is damaged (its entry for key.json is"),
    ],
)
def test_a_contents_file_naming_files_outside_its_stage_is_damage(tmp_path, listing, problem):
    """A store from elsewhere is read, never trusted: contents.json cannot make the store read files outside."""
    store = Store(tmp_path)
    stage = store.stage("train", {"x": 4})
    reuse(store, stage, [])
    (stage.path / "contents.json").write_text(json.dumps(listing))
    assert stage.problem().startswith(problem)
