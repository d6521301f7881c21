"""`harness grid` end to end on a random 2-layer Llama: every cell runs once, a second run reuses all, a grid killed
part-way and started again ends with the same tables byte for byte, a failed cell does not stop the others,
submitit's local executor runs the same cells as jobs, and two runs of one cell at once share each stage."""

import contextlib
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from harness.grid import executors
from harness.grid import spec as grid

SPEC = """\
preset: tiny
overrides:
  base_model: {base}
  oracle_model: {base}
  train_data.path: {corpus}
  eval_data.path: {corpus}
  train.steps: 3
  train.batch_size: 2
  train.seq_len: 16
  eval.num_prompts: 6
  eval.prompt_tokens: 4
  eval.new_tokens: 8
  eval.batch_size: 3
groups:
  robustness:
    methods:
      gu-kgw: [{{}}]
    attacks:
      none: [{{}}]
      slerp: [{{t: 0.3}}, {{t: 0.7}}]
  configs:
    methods:
      gu-kgw: [{{k: 0, delta: 1}}]
attribution: robustness
"""


@pytest.fixture(scope="module")
def grid_spec(tmp_path_factory, random_llamas):
    import json

    folder = tmp_path_factory.mktemp("grid")
    corpus = folder / "corpus.jsonl"
    texts = [
        "The quick brown fox jumps over the lazy dog and runs into the forest to find more food.",
        "Return the number of items in the list, or raise an error if it is empty; lists are ordered.",
        "A watermark is a hidden signal in generated text that a detector can find with a secret key.",
    ] * 8
    corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    path = folder / "grid.yaml"
    path.write_text(SPEC.format(base=random_llamas[1], corpus=corpus))
    return path


def files_of(folder):
    return {p.relative_to(folder): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def uninterrupted(grid_spec, harness, tmp_path_factory):
    root = tmp_path_factory.mktemp("uninterrupted") / "runs"
    first = harness("grid", str(grid_spec), "--results", str(root), timeout=900)
    assert first.returncode == 0, first.stderr[-3000:]
    tables = root.parent / "tables"
    out = harness("tables", "--results", str(root), "--out", str(tables))
    assert out.returncode == 0, out.stderr[-2000:]
    return root, first, tables


def test_grid_runs_every_cell_once_then_reuses_them(uninterrupted, grid_spec, harness, cli):
    root, first, tables = uninterrupted
    assert "4 cells: 0 reused, 4 computed, 0 failed; attribution ok" in first.stdout
    assert len(list((root / "stages" / "train").glob("*/DONE"))) == 2  # two configurations, each trained once
    again = harness("grid", str(grid_spec), "--results", str(root), timeout=600)
    assert again.returncode == 0 and "4 cells: 4 reused, 0 computed, 0 failed" in again.stdout, again.stdout
    assert "computing" not in again.stderr and "reusing" in again.stderr
    dry = cli("grid", str(grid_spec), "--results", str(root), "--dry-run")
    assert dry.returncode == 0 and "4 of 4 cells stored; 0 to compute" in dry.stdout, dry.stdout
    names = {p.name for p in tables.rglob("*")}
    assert {"robustness.csv", "attribution.csv", "watermark_config.csv", "auc_vs_slerp.png"} <= names
    attribution = (next(tables.rglob("attribution.csv"))).read_text()
    assert "Unwatermarked base" in attribution and "Gu-KGW (k=1, delta=2)" in attribution


def test_dry_run_verifies_what_it_calls_stored_and_checks_inputs_first(uninterrupted, grid_spec, cli, tmp_path):
    """A damaged run is not "stored" (the real grid would recompute it), and a model that does not exist is one line
    naming the spec line, as the real grid says it, not a listing that exits 0."""
    import shutil

    root = tmp_path / "runs"
    shutil.copytree(uninterrupted[0], root)
    import json

    (run,) = [p.parent for p in root.glob("*/spec.json") if json.loads(p.read_text())["row"] == "SLERP t=0.7"]
    (run / "metrics.json").write_text((run / "metrics.json").read_text()[:20])  # truncated: one cell's run
    dry = cli("grid", str(grid_spec), "--results", str(root), "--dry-run")
    assert dry.returncode == 0 and "3 of 4 cells stored; 1 to compute" in dry.stdout, dry.stdout
    bad = tmp_path / "bad.yaml"
    bad.write_text(grid_spec.read_text().replace("  base_model: ", "  base_model: /no/such/model #"))
    dry = cli("grid", str(bad), "--results", str(root), "--dry-run")
    assert dry.returncode == 2 and dry.stdout == "", dry.stdout
    assert dry.stderr.startswith(
        f"harness: error: {bad}:17 (gu-kgw(k=1, delta=2) x none): model path '/no/such/model"
    ), dry.stderr


def test_a_killed_grid_resumes_to_the_same_tables(uninterrupted, grid_spec, harness, cli, script, tmp_path):
    _, _, want = uninterrupted
    root = tmp_path / "runs"
    command = [script("harness"), "grid", str(grid_spec), "--results", str(root)]
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.time() + 600
    while time.time() < deadline and not list(root.glob("*/DONE")):  # the first finished run: part-way
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    finished = len(list(root.glob("*/DONE")))
    assert finished >= 1
    again = harness("grid", str(grid_spec), "--results", str(root), timeout=900)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "0 failed" in again.stdout
    out = cli("tables", "--results", str(root), "--out", str(tmp_path / "tables"))
    assert out.returncode == 0, out.stderr[-2000:]
    assert files_of(tmp_path / "tables") == files_of(want)


def test_a_failed_cell_is_reported_and_the_others_go_on(grid_spec, tmp_path, monkeypatch):
    from harness.cell.pipeline import Pipeline

    real = Pipeline.run

    def flaky(self, method, attack):
        if attack.name == "slerp" and attack.params.t == 0.7:
            raise RuntimeError("out of memory (simulated)")
        return real(self, method, attack)

    monkeypatch.setattr(Pipeline, "run", flaky)
    summary = executors.run(grid.load(grid_spec), tmp_path / "runs", "cpu")
    assert (summary["computed"], summary["failed"]) == (3, 1)
    ((name, error, trace),) = summary["failures"]
    assert name == "gu-kgw(k=1, delta=2) x slerp(t=0.7)" and "out of memory" in error
    assert "RuntimeError" in trace.read_text()


def test_submitit_local_executor_runs_the_cells_as_jobs(grid_spec, harness, tmp_path):
    pytest.importorskip("submitit")
    spec = tmp_path / "grid.yaml"  # two trainings, two cells: each a job of its own
    spec.write_text(grid_spec.read_text().replace("[{t: 0.3}, {t: 0.7}]", "[]").replace("none: [{}]", "none: [{}]\n"))
    spec.write_text(spec.read_text().replace("      slerp: []\n", ""))
    root = tmp_path / "runs"
    out = harness("grid", str(spec), "--results", str(root), "--executor", "local", "--time-min", "20",
                  timeout=1200)  # fmt: skip
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    assert "2 cells: 0 reused, 2 computed, 0 failed; attribution ok" in out.stdout
    # One job per training, then one per cell, then attribution's ("attribution ok" above).
    assert "training: submitted 2 jobs" in out.stderr and "cell: submitted 2 jobs" in out.stderr, out.stderr
    assert len(list((root / "stages" / "train").glob("*/DONE"))) == 2


def _processes_mentioning(text: str) -> list[int]:
    """PIDs of this machine's processes whose command line holds ``text``."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and text in (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode():
                found.append(int(proc.name))
        except OSError:
            continue
    return found


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT])
def test_stopping_a_local_grid_stops_its_jobs_and_says_so_once(grid_spec, script, tmp_path, stop):
    pytest.importorskip("submitit")
    spec = tmp_path / "long.yaml"  # one cell whose training outlasts the test
    spec.write_text(grid_spec.read_text().replace("train.steps: 3", "train.steps: 1000000"))
    jobs = tmp_path / "jobs"
    command = [script("harness"), "grid", str(spec), "--results", str(tmp_path / "runs"), "--executor", "local",
               "--jobs-dir", str(jobs)]  # fmt: skip
    # Stopped by SIGINT, as a terminal's Ctrl-C stops it: a process that does not ignore SIGINT (whatever this test
    # runs under). Stopped by SIGTERM, as a scheduler or `kill` stops a background job of a script: started with
    # SIGINT ignored, as such a job is, and so is every job it starts, which must be stopped all the same.
    keep = signal.SIG_DFL if stop == signal.SIGINT else signal.SIG_IGN
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, keep))  # fmt: skip
    # A job: a process started for the jobs folder other than the grid itself (whose command line names the folder
    # too: waiting on that alone sent the signal while the grid was still importing torch on a slower machine).
    jobs_started = lambda: [pid for pid in _processes_mentioning(str(jobs)) if pid != proc.pid]  # noqa: E731
    try:
        deadline = time.time() + 300
        while not jobs_started() and time.time() < deadline:
            time.sleep(0.5)
        assert jobs_started(), "no job started"
        time.sleep(3)  # the job is training
        proc.send_signal(stop)
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 130, err
        assert "Traceback" not in err and err.count("interrupted") == 1, err
        assert "jobs of this grid cancelled" in err
        deadline = time.time() + 30
        while _processes_mentioning(str(jobs)) and time.time() < deadline:
            time.sleep(0.5)
        assert not _processes_mentioning(str(jobs)), "a job outlived its grid"
    finally:  # a failed check leaves no million-step training behind on the machine
        for pid in [proc.pid, *_processes_mentioning(str(jobs))]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_two_runs_of_one_cell_at_once_compute_each_stage_once(grid_spec, script, tmp_path):
    """What the smoke tests' shared store relies on (tests/conftest.py ``shared_store``): two ``harness run`` of one
    cell started together on one store both succeed, each stage is computed by one of them while the other waits on
    its lock and then reuses it, and both print the same results."""
    import yaml

    overrides = yaml.safe_load(grid_spec.read_text())["overrides"]
    sets = [arg for key, value in overrides.items() for arg in ("--set", f"{key}={value}")]
    command = [script("harness"), "run", "--method", "gu-kgw", "--attack", "slerp", "--attack-arg", "t=0.3", *sets,
               "--results", str(tmp_path / "runs")]  # fmt: skip
    procs = [subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [proc.communicate(timeout=900) for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0], [err[-3000:] for _, err in outs]
    logged = "\n".join(err for _, err in outs)
    computed = re.findall(r"computing (.+) ([0-9a-f]{16})$", logged, re.M)
    reused = re.findall(r"reusing (.+) ([0-9a-f]{16}) \(", logged, re.M)
    # Train, its KGW green lists, attack, 3 generations, 3 held-out perplexities, 3 runs: each computed once, and
    # reused by the other process.
    assert len(computed) == len(set(computed)) == 12, computed
    assert set(reused) == set(computed), (computed, reused)
    first, second = (o.replace("(reused)", "").split() for o, _ in outs)
    assert first == second  # the same runs, the same numbers
