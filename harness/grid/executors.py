"""Running a grid's jobs: here, one after the other (``inline``), or as submitit jobs on this machine (``local``) or
on a Slurm cluster (``slurm``); first one job per model to train, then one per cell, then one for attribution."""

from __future__ import annotations

import logging
import signal
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.config.errors import HarnessError
from harness.grid.jobs import _first_line, attribute, check_cells, run_cell, train_cell
from harness.grid.spec import Cell, Grid, shard

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Resources:
    """What each cluster job asks for (submitit's parameters; the ones left None are the cluster's defaults)."""

    partition: str | None = None
    account: str | None = None
    gpus: int | None = None
    cpus: int | None = None
    mem_gb: int | None = None
    time_min: int | None = None  # None: 240
    max_parallel: int | None = None

    def given(self, names: tuple[str, ...]) -> list[str]:
        """The options among ``names`` that were given (as the command line spells them)."""
        return [f"--{name.replace('_', '-')}" for name in names if getattr(self, name) is not None]


EXECUTORS = ("inline", "local", "slurm")
SLURM_ONLY = ("partition", "account", "max_parallel")
JOB_OPTIONS = ("gpus", "cpus", "mem_gb", "time_min")  # what a submitted job asks for: local and Slurm jobs
MAX_RESOURCE = 2**31 - 1  # the largest count a job option takes (Slurm keeps them as 32-bit numbers)


def check_options(kind: str, res: Resources) -> None:
    """Options of another executor are refused, never ignored: Slurm's with ``local`` or ``inline``, and those of
    submitted jobs with ``inline`` (cells run in this process)."""
    if kind not in EXECUTORS:
        raise HarnessError(f"unknown executor '{kind}'. Valid executors: {', '.join(EXECUTORS)}")
    for name in ("gpus", "cpus", "mem_gb", "time_min", "max_parallel"):
        value = getattr(res, name)
        if value is not None and value < (0 if name == "gpus" else 1):
            raise HarnessError(f"--{name.replace('_', '-')} {value}: must be at least {0 if name == 'gpus' else 1}")
        if value is not None and value > MAX_RESOURCE:
            raise HarnessError(f"--{name.replace('_', '-')} {value}: must be at most {MAX_RESOURCE}")
    if kind != "slurm" and res.given(SLURM_ONLY):
        raise HarnessError(f"{', '.join(res.given(SLURM_ONLY))}: only for --executor slurm")
    if kind == "inline" and res.given(JOB_OPTIONS):
        raise HarnessError(
            f"{', '.join(res.given(JOB_OPTIONS))}: only for --executor local or slurm (what each submitted job asks "
            "for; the inline executor runs cells in this process)"
        )


def make_executor(kind: str, jobs_dir: Path, res: Resources):
    """A submitit executor for ``local`` (subprocesses on this machine) or ``slurm``; ``inline`` is None (cells run in
    this process, one after the other)."""
    check_options(kind, res)
    if kind == "inline":
        return None
    try:
        import submitit
    except ImportError:
        raise HarnessError(
            f"executor '{kind}' needs the Python package 'submitit': pip install 'watermark-harness[cluster]'"
        ) from None
    params: dict[str, Any] = {"timeout_min": res.time_min or 240}
    if res.gpus is not None:
        params["gpus_per_node"] = res.gpus
    if res.cpus is not None:
        params["cpus_per_task"] = res.cpus
    if res.mem_gb is not None:
        params["mem_gb"] = res.mem_gb
    if kind == "slurm":
        import shutil

        if shutil.which("sbatch") is None:
            raise HarnessError("executor 'slurm' needs Slurm's 'sbatch' on this machine's PATH and found none")
        params.update(
            {
                k: v
                for k, v in {
                    "slurm_partition": res.partition,
                    "slurm_account": res.account,
                    "slurm_array_parallelism": res.max_parallel,
                }.items()
                if v is not None
            }
        )
    jobs_dir.mkdir(parents=True, exist_ok=True)
    executor = submitit.AutoExecutor(folder=str(jobs_dir / "%j"), cluster=kind)
    executor.update_parameters(**params)
    return executor


class Submitted:
    """A grid's submitit executor and every job it submitted, so that a grid that is stopped stops its jobs.

    Jobs are submitted with this process's stdout and stderr sent to ``<jobs>/submitit.log``: a local job's
    controller inherits them, and its own messages (a traceback when it is stopped) stay out of the terminal."""

    def __init__(self, executor, folder: Path):
        self.executor, self.folder, self.jobs = executor, folder, []

    def map(self, fn, items: list, *args) -> list:
        from harness.compute.progress import library_output

        with library_output(self.folder / "submitit.log"):
            jobs = self.executor.map_array(fn, items, *([arg] * len(items) for arg in args))
        self.jobs += jobs
        return jobs

    def submit(self, fn, *args):
        from harness.compute.progress import library_output

        with library_output(self.folder / "submitit.log"):
            job = self.executor.submit(fn, *args)
        self.jobs.append(job)
        return job

    def cancel(self, grace_s: float = 10.0) -> int:
        """Cancel every job not finished yet; return how many. A local job is its controller process and the task it
        started: the controller is sent SIGINT (submitit's cancel, on which it stops its task), and whatever of the
        two still runs after ``grace_s`` is killed, since a process started where SIGINT is ignored (a background job
        of a script, nohup) ignores it too, and the task ignores SIGTERM (submitit keeps it for preemption)."""
        running = [job for job in self.jobs if not job.done()]
        local = [p for job in running for p in _process_tree(job)]
        for job in running:
            job.cancel(check=False)
        if local:
            import psutil

            _, alive = psutil.wait_procs(local, timeout=grace_s)
            for proc in alive:
                try:
                    proc.kill()
                except psutil.Error:
                    pass
        return len(running)


def _process_tree(job) -> list:
    """The processes of a local submitit job (its controller and the controller's descendants); none for a
    cluster job."""
    import psutil

    process = getattr(job, "_process", None)
    if process is None or process.poll() is not None:
        return []
    try:
        root = psutil.Process(process.pid)
        return [root, *root.children(recursive=True)]
    except psutil.Error:
        return []


def _result(job) -> dict:
    """A job's outcome; one that failed outside the job function (killed, timed out) as a failure."""
    import submitit

    try:
        return job.result()
    except (submitit.core.utils.FailedJobError, submitit.core.utils.UncompletedJobError) as err:
        return {"status": "failed", "error": f"job {job.job_id}: {_first_line(err)}", "traceback": str(err)}


def _map(
    jobs: Submitted | None, fn, items: list[Cell], results: Path, device: str | None, what: str, with_seed: bool = False
) -> list[dict]:
    """``fn(item, results, device)`` for every item: inline in order, or as one submitit job array (waited for)."""
    if not items:
        return []
    if jobs is None:
        out = []
        for k, item in enumerate(items, 1):
            log.info("%s %d/%d: %s", what, k, len(items), item.name(with_seed))
            out.append(fn(item, str(results), device))
            log.info("%s %d/%d: %s", what, k, len(items), out[-1]["status"])
        return out
    submitted = jobs.map(fn, items, str(results), device)
    log.info("%s: submitted %d jobs (%s); waiting", what, len(submitted), ", ".join(j.job_id for j in submitted[:5]))
    return [_result(job) for job in submitted]


def _stop(signum, frame):
    """SIGTERM (a batch system's, a ``kill``) stops a grid as Ctrl-C does: its jobs are cancelled, what finished
    stays."""
    raise KeyboardInterrupt


def run(
    grid: Grid,
    results: Path,
    device: str | None = None,
    executor_kind: str = "inline",
    shard_of: tuple[int, int] | None = None,
    jobs_dir: Path | None = None,
    resources: Resources | None = None,
) -> dict:
    """Run the grid's cells (or one shard of them) and its attribution; return the summary counts and failures."""
    from harness.store.stages import Store

    cells = list(grid.cells) if shard_of is None else shard(grid.cells, *shard_of)
    folder = jobs_dir or results / "jobs"
    executor = make_executor(executor_kind, folder, resources or Resources())
    check_cells(cells, results=results)  # before any cell runs: a missing model or dataset fails the grid in seconds
    Store(results).check_writable()
    Store(results).sweep()
    jobs = Submitted(executor, folder) if executor is not None else None
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _stop) if main_thread else None
    try:
        return _run(grid, cells, jobs, results, device, shard_of)
    except BaseException:
        if jobs is not None:
            log.warning("stopping: %d jobs of this grid cancelled", jobs.cancel())
        raise
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, previous)


def _run(grid: Grid, cells: list[Cell], jobs: Submitted | None, results: Path, device: str | None, shard_of) -> dict:
    trainings = list({c.training: c for c in cells}.values())
    failures: list[tuple[str, dict]] = []
    if jobs is not None and len(trainings) > 1:  # one job per model first: cells then never wait on a training
        for cell, res in zip(
            trainings,
            _map(jobs, train_cell, trainings, results, device, "training", grid.several_seeds),
            strict=True,
        ):
            if res["status"] == "failed":
                log.warning("training for %s failed: %s", cell.name(), res["error"])
    outcomes = _map(jobs, run_cell, cells, results, device, "cell", grid.several_seeds)
    summary = {"cells": len(cells), "reused": 0, "computed": 0, "failed": 0}
    for cell, res in zip(cells, outcomes, strict=True):
        summary[res["status"]] += 1
        if res["status"] == "failed":
            failures.append((cell.name(grid.several_seeds), res))
    if grid.attribution and shard_of is None:
        log.info("attribution: %d detectors on the texts of %d models and the base", len(grid.attribution),
                 len(grid.attribution))  # fmt: skip
        if jobs is None:
            res = attribute(grid.attribution, str(results), device)
        else:  # one job, where the detectors' models (GPU) are
            res = _result(jobs.submit(attribute, grid.attribution, str(results), device))
        if res["status"] == "failed":
            failures.append(("attribution", res))
        summary["attribution"] = res["status"]
    summary["failures"] = [(name, res["error"], _keep_trace(results, name, res["traceback"])) for name, res in failures]
    return summary


def _keep_trace(results: Path, name: str, trace: str) -> Path:
    """Write a failure's traceback under ``<results>/failures/`` and return the file."""
    import hashlib
    import time

    folder = results / "failures"
    folder.mkdir(parents=True, exist_ok=True)
    file = folder / f"{time.strftime('%Y%m%dT%H%M%S')}-{hashlib.sha256(name.encode()).hexdigest()[:10]}.txt"
    file.write_text(f"{name}\n\n{trace}")
    return file
