"""Progress lines in logs, and the tiny model's cache: built once by one of several processes, nothing left behind
by an interrupted build."""

import logging
import os
import signal
import subprocess
import sys
from pathlib import Path

from harness.compute.progress import Progress


def test_progress_logs_plain_lines_off_a_terminal(caplog):
    caplog.set_level(logging.INFO, logger="harness")
    with Progress(4, "generate (test)", unit="text", every_s=0) as bar:
        for _ in range(4):
            bar.update(1, loss="1.0")
    lines = [r.getMessage() for r in caplog.records]
    assert lines[0].startswith("generate (test): 1/4 texts (25%)") and "loss=1.0" in lines[0]
    assert lines[-1].startswith("generate (test): 4/4 texts (100%)")


FAKE_TINY_BUILD = """
import os, sys, time
from harness.assets import tiny
def fake_build(out):
    with open(sys.argv[1], "a") as fh:
        fh.write(f"{os.getpid()}\\n")
    print("building", flush=True)
    time.sleep(float(sys.argv[2]))
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        (out / name).write_text("{}")
    return {}
tiny.build = fake_build
print(tiny.tiny_lm(), flush=True)
"""


def _fake_tiny(tmp_path, seconds):
    env = {**os.environ, "HARNESS_CACHE": str(tmp_path / "cache")}
    args = [sys.executable, "-c", FAKE_TINY_BUILD, str(tmp_path / "builders.txt"), str(seconds)]
    # SIGINT back to its default: a shell's background job starts with it ignored, and Python then never raises
    # KeyboardInterrupt.
    restore = lambda: signal.signal(signal.SIGINT, signal.SIG_DFL)  # noqa: E731
    return subprocess.Popen(args, env=env, stdout=subprocess.PIPE, text=True, preexec_fn=restore)


def test_parallel_processes_build_the_tiny_model_once(tmp_path):
    procs = [_fake_tiny(tmp_path, 1.5) for _ in range(3)]
    folders = {p.communicate(timeout=60)[0].strip().splitlines()[-1] for p in procs}
    assert [p.returncode for p in procs] == [0, 0, 0]
    assert len(folders) == 1 and len((tmp_path / "builders.txt").read_text().splitlines()) == 1  # one builder


def test_interrupted_tiny_build_leaves_nothing(tmp_path):
    proc = _fake_tiny(tmp_path, 30)
    assert proc.stdout.readline().strip() == "building"
    proc.send_signal(signal.SIGINT)
    assert proc.wait(30) != 0
    assert not [p for p in (tmp_path / "cache").iterdir() if p.is_dir()]  # nothing published, nothing half-written
    proc = _fake_tiny(tmp_path, 0)  # the next process builds it
    folder = proc.communicate(timeout=60)[0].strip().splitlines()[-1]
    assert proc.returncode == 0 and (Path(folder) / "DONE").exists()
    assert len((tmp_path / "builders.txt").read_text().splitlines()) == 2  # the interrupted build and this one
