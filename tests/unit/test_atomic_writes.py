"""Every file the harness writes for people (tables, figures, the report) and the hash index is replaced whole
(``files.replacing``): a full disk or a kill midway leaves the previous file byte for byte and no temporary file that
outlives its writer, and two writers at once leave one of their files, whole."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import threading

import pytest

from harness.store import files


def others(folder, *keep) -> list[str]:
    """Names in ``folder`` other than ``keep`` (temporary files left behind)."""
    return sorted(p.name for p in folder.iterdir() if p.name not in keep)


def test_a_write_that_fails_midway_leaves_the_previous_file(tmp_path):
    file = tmp_path / "report.html"
    file.write_bytes(b"previous " * 1000)
    with pytest.raises(OSError, match="No space left"):
        with files.replacing(file) as fh:
            fh.write(b"new, cut ")
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    assert file.read_bytes() == b"previous " * 1000
    assert others(tmp_path, "report.html") == []


def test_a_full_disk_seen_only_at_fsync_leaves_the_previous_file(tmp_path, monkeypatch):
    """With delayed allocation, a full disk may show only when the data is flushed: the file is fsync'd before it is
    renamed, so the failure is seen while the previous file is still in place."""
    file = tmp_path / "runs.csv"
    file.write_text("previous\n")

    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(files.os, "fsync", full)
    with pytest.raises(OSError, match="No space left"):
        files.write_atomic(file, "new\n")
    assert file.read_text() == "previous\n" and others(tmp_path, "runs.csv") == []


def test_two_writers_at_once_leave_one_whole_file(tmp_path):
    file = tmp_path / "report.html"
    start = threading.Barrier(2)
    errors = []

    def write(byte: bytes) -> None:
        try:
            start.wait()
            with files.replacing(file) as fh:
                for _ in range(200):  # in chunks, each a chance for the other thread to write in between
                    fh.write(byte * 1000)
                    os.sched_yield()
        except Exception as err:  # (a thread's exception would otherwise be lost)
            errors.append(err)

    threads = [threading.Thread(target=write, args=(b,)) for b in (b"a", b"b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert file.read_bytes() in (b"a" * 200_000, b"b" * 200_000)
    assert others(tmp_path, "report.html") == []


def test_a_replaced_file_keeps_its_permissions_and_a_new_one_gets_the_umasks(tmp_path):
    old, new = tmp_path / "old.tex", tmp_path / "new.tex"
    old.write_text("x")
    old.chmod(0o640)
    files.write_atomic(old, "y")
    files.write_atomic(new, "y")
    umask = os.umask(0)
    os.umask(umask)
    assert (old.stat().st_mode & 0o777, new.stat().st_mode & 0o777) == (0o640, 0o666 & ~umask)


LIMITED = """
import resource, signal, sys
import matplotlib.pyplot, harness.report.figures, harness.report.html  # (imported before the limit: font caches)
from harness.cli.main import main
# Python ignores SIGXFSZ, so a write past the limit fails with EFBIG as on a full disk; its default action kills.
signal.signal(signal.SIGXFSZ, signal.SIG_IGN if sys.argv[1] == "full" else signal.SIG_DFL)
resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[2]), resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
sys.exit(main(sys.argv[3:]))
"""


def limited(how: str, limit: int, *args: str) -> subprocess.CompletedProcess:
    """``harness *args`` in a process that may write no file past ``limit`` bytes: past it, a write fails as on a
    full disk (``how`` "full") or the process is killed midway by SIGXFSZ ("kill")."""
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    return subprocess.run([sys.executable, "-c", LIMITED, how, str(limit), *args], capture_output=True, text=True,
                          timeout=300, env=env)  # fmt: skip


@pytest.mark.parametrize("how", ["full", "kill"])
def test_a_report_cut_midway_leaves_the_previous_report(two_method_store, cli, tmp_path, how):
    report = tmp_path / "out" / "report.html"
    args = ("report", "--results", str(two_method_store.root), "--out", str(report))
    assert cli(*args).returncode == 0
    before = report.read_bytes()
    cut = limited(how, len(before) // 2, *args)
    if how == "full":
        assert cut.returncode == 2 and "cannot write the report" in cut.stderr, cut.stderr[-2000:]
        assert "File too large" in cut.stderr and others(report.parent, "report.html") == []
    else:
        assert cut.returncode == -signal.SIGXFSZ, cut.stderr[-2000:]
    assert report.read_bytes() == before
    assert cli(*args).returncode == 0  # and the next report sweeps what the killed one left
    assert report.read_bytes() == before and others(report.parent, "report.html") == []


def test_tables_cut_by_a_full_disk_leave_every_previous_file(two_method_store, cli, tmp_path):
    out = tmp_path / "tables"
    args = ("tables", "--results", str(two_method_store.root), "--out", str(out))
    assert cli(*args).returncode == 0
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    biggest = max(len(b) for b in before.values())
    assert any(p.suffix == ".png" for p in before) and biggest > 8000
    cut = limited("full", 8000, *args)  # (the CSV and LaTeX files fit; a figure does not)
    assert cut.returncode == 2 and "cannot write the tables" in cut.stderr, cut.stderr[-2000:]
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before  # nothing cut, nothing left over


FULL_DISK = r"""
import json, resource, signal, sys
from pathlib import Path
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # (past the size limit a write fails with EFBIG instead of a signal)
import torch
from safetensors.torch import save_file
from harness.config.errors import HarnessError
from harness.store.stages import Store

stage = Store(Path(sys.argv[1])).stage("train", {"stage": "train", "what": "a model larger than the disk"})
resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))  # a 1 MiB file at most: the disk is "full"
try:
    stage.build(lambda out: save_file({"w": torch.zeros(1 << 20)}, str(out / "model.safetensors")) or {})
except HarnessError as err:
    print(json.dumps({"error": str(err), "done": stage.done}))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_FSIZE and SIGXFSZ (Linux)")
def test_a_full_disk_while_a_stage_writes_is_one_line_and_leaves_nothing_that_reads_as_done(tmp_path):
    """A write that finds no room (here EFBIG, as a file-size limit or a full disk gives it) inside a library that
    reports it its own way (safetensors: a Rust IoError as text) is one line naming the stage and what it had
    written; no DONE, no partial folder left."""
    import json

    out = subprocess.run([sys.executable, "-c", FULL_DISK, str(tmp_path / "runs")], capture_output=True, text=True,
                         timeout=300)  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    found = json.loads(out.stdout.strip().splitlines()[-1])
    assert "the disk is full" in found["error"] and "train stage" in found["error"] and not found["done"]
    assert "\n" not in found["error"] and "bytes" in found["error"]
    assert not [p for p in (tmp_path / "runs").rglob("*") if p.is_file()], "something was left behind"
