"""The run store: one folder per stage result, named by a hash of everything that determines it.

``<root>/<hash>/`` holds a run (one table cell: full resolved config -> metrics); ``<root>/stages/<kind>/<hash>/``
holds what runs share (trained, attacked models; generations). Each folder is built under a temporary name, under a
lock per stage (a second process waits, then reuses), and renamed into place after ``contents.json`` (the size and
sha256 of every file) and ``DONE`` are written, so a crash never leaves a folder that looks finished.

A finished stage is verified against ``contents.json`` before anything reads it. A file that is missing, or that
differs from what was published and no longer reads in its format (truncated JSON, JSON lines or safetensors; another
size for other files), makes the stage *damaged*: it is moved to ``<root>/damaged/`` and built again. A file that
differs but still reads was *edited*: it is refused, since a stored number must never silently change meaning.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import platform
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from harness.compute import distributed, memory
from harness.config.errors import HarnessError, first_line
from harness.store import files, kinds
from harness.store.versions import git_sha, machine, versions

log = logging.getLogger(__name__)


def spec_hash(spec: dict) -> str:
    """Stable short hash of a JSON-able spec (key order does not matter)."""
    blob = json.dumps(spec, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


CONTENTS = "contents.json"
LOCKS = ".locks"
# The folders of a store's root besides its runs: only this module spells them (and the layout they make).
STAGES = "stages"  # <root>/stages/<kind>/<hash>/: every stage but the runs
DAMAGED = "damaged"  # where damaged or unfinished stages are set aside


class EditedStage(HarnessError):
    """A stored file differs from what its stage published yet still reads in its format: refused, never reused or
    replaced."""


def lock_file(root: Path, kind: str, key: str) -> Path:
    """The lock that one process holds while it checks or builds stage ``kind/key`` of the store at ``root``."""
    return root / LOCKS / f"{kind}-{key}.lock"


def contents(folder: Path) -> dict:
    """``{relative path: {"size", "sha256"}}`` of every file under ``folder`` except the markers."""
    out = {}
    for file in sorted(p for p in folder.rglob("*") if p.is_file()):
        rel = file.relative_to(folder).as_posix()
        if rel not in (CONTENTS, "DONE"):
            out[rel] = {"size": file.stat().st_size, "sha256": files.file_sha256(file)}
    return out


@dataclass(frozen=True)
class Stage:
    """One stored result: its spec, its hash and its folder."""

    kind: str
    spec: dict
    key: str
    path: Path
    root: Path

    @property
    def done(self) -> bool:
        return (self.path / "DONE").exists()

    @property
    def lock_file(self) -> Path:
        return lock_file(self.root, self.kind, self.key)

    def manifest(self) -> dict:
        return json.loads((self.path / "manifest.json").read_text())

    def problem(self) -> str | None:
        """Why this finished stage cannot be trusted as it is (None: it can). Raises ``EditedStage`` when a file
        was changed in place; returns the reason when the stage is damaged or incomplete, or is not this store's
        stage of its name: a link to a folder (elsewhere), or a spec that hashes to another name (a stage
        renamed, or edited with its contents.json)."""
        if self.path.is_symlink():  # (a kind's folder, or the store, may lie on another disk; a stage is a folder)
            return f"it is a link to '{self.path.resolve()}', not a folder of the store's own"
        try:
            published = json.loads((self.path / CONTENTS).read_text())
        except FileNotFoundError:
            return f"{CONTENTS} is missing"
        except (ValueError, RecursionError):  # (JSON nested past Python's recursion limit)
            return f"{CONTENTS} is damaged"
        if not isinstance(published, dict):
            return f"{CONTENTS} is damaged"
        outside = [rel for rel in published if not files.stays_inside(rel)]
        if outside:  # (a store from elsewhere is read, never trusted)
            return f"{CONTENTS} names a file outside its stage ({outside[0]})"
        for rel, want in published.items():
            if not (
                isinstance(want, dict) and isinstance(want.get("size"), int) and isinstance(want.get("sha256"), str)
            ):
                return f"{CONTENTS} is damaged (its entry for {rel} is {json.dumps(want)[:60]})"
            file = self.path / rel
            if not file.is_file():
                return f"{rel} is missing"
            size = file.stat().st_size
            if size == want["size"] and files.file_sha256(file) == want["sha256"]:
                continue
            if file.suffix in files.FORMATS:
                damage = files.unreadable(file)
            else:
                damage = None if size == want["size"] else "its size changed"
            if damage:
                return f"{rel} is damaged ({damage}; {size} bytes where {want['size']} were published)"
            raise EditedStage(
                f"{self.path / rel} was changed after its {self.kind} stage published it (sha256 differs), so "
                f"results built from it cannot be trusted; move '{self.path}' away to rebuild that stage"
            )
        if "spec.json" in published:
            try:
                named = spec_hash(json.loads((self.path / "spec.json").read_text()))
            except (ValueError, RecursionError):
                return "spec.json is damaged"
            if named != self.key:
                return f"its spec.json hashes to {named}, not to its folder's name (renamed, or edited with {CONTENTS})"
        return None

    def build(self, fn: Callable[[Path], dict]) -> None:
        """Run ``fn(tmp_folder)`` (it writes the outputs and returns a report), then publish the folder atomically.
        Call while holding the stage's lock (``Store.build_or_reuse`` does)."""
        tmp = self.path.with_name(f".{self.path.name}.partial-{files.owner_tag()}")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        start, sha = time.time(), git_sha()  # the commit before the build: it may be long
        try:
            with memory.stage_peak() as peak:
                try:
                    report = fn(tmp)
                except Exception as err:  # noqa: BLE001  (a full disk, whatever library was writing: one line)
                    if files.disk_full(err):
                        raise HarnessError(
                            f"the disk is full under '{self.root}' while the {self.kind} stage {self.key} was written "
                            f"({type(err).__name__}: {first_line(err)[:200]}): it had written "
                            f"{files.folder_bytes(tmp):,} bytes; free space and run again (finished stages are kept "
                            "and reused; nothing of this one is)"
                        ) from None
                    raise
            manifest = {
                "kind": self.kind,
                "hash": self.key,
                "versions": versions(),
                "git_sha": sha,
                "host": platform.node(),
                "machine": machine(),
                "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(start)),
                "seconds": round(time.time() - start, 2),
                "peak_memory": peak,
                "report": report,
            }
            (tmp / "spec.json").write_text(json.dumps(self.spec, indent=2, sort_keys=True, default=str))
            (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2, default=str))
            (tmp / CONTENTS).write_text(json.dumps(contents(tmp), indent=1, sort_keys=True))
            (tmp / "DONE").write_text("")
            if self.path.exists():  # an unfinished or foreign folder under our name: kept aside, never deleted
                moved = set_aside(self.root, self.path)
                log.warning("%s held an unfinished stage (no DONE): moved to %s", self.path, moved)
            tmp.rename(self.path)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def update(self, texts: dict[str, str]) -> None:
        """Replace files of this finished stage (e.g. its metrics brought up to date) and publish its contents anew:
        each file, then ``contents.json``, is written atomically. Call while holding the stage's lock, after checking
        that the stage is intact (``problem``)."""
        for name, text in texts.items():
            files.write_atomic(self.path / name, text)
        files.write_atomic(self.path / CONTENTS, json.dumps(contents(self.path), indent=1, sort_keys=True))


def set_aside(root: Path, folder: Path) -> Path:
    """Move a damaged or unfinished stage folder to ``<root>/damaged/`` (nothing is deleted) and return where it
    went; a folder that cannot be moved (a read-only store) is one line saying what to do."""
    rel = folder.relative_to(root).as_posix().replace("/", "-")
    dest = root / DAMAGED / f"{rel}-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}"
    inside = os.path.join(os.path.realpath(root), DAMAGED)
    if (
        dest.parent.is_symlink()
        or os.path.realpath(dest.parent) != inside
        or dest.parent.exists() != dest.parent.is_dir()
    ):
        raise HarnessError(
            f"'{folder}' must be set aside (it is damaged or unfinished) but {dest.parent} is "
            f"{'a symbolic link' if dest.parent.is_symlink() else 'not a folder of the store'}: a stage is moved only "
            "into the store's own damaged/ folder; remove or rename it"
        )
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        folder.rename(dest)
    except OSError as err:
        raise HarnessError(
            f"'{folder}' must be set aside (it is damaged or unfinished) but cannot be moved to {dest.parent}: "
            f"{err.strerror or err}; move it away by hand"
        ) from None
    return dest


class Store:
    def __init__(self, root: Path):
        self.root = Path(root)

    def check_writable(self, create: bool = True) -> None:
        """Fail early, in one line, if results cannot be written here (``create=False``: a dry run's check, which
        makes no folder), or where a file lies where the store keeps a folder (its stages, a kind's, its locks)."""
        files.check_writable(self.root, "results folder", create)
        kinds_ = list((self.root / STAGES).iterdir()) if (self.root / STAGES).is_dir() else []
        for path in (self.root / STAGES, self.root / LOCKS, *kinds_):
            if path.exists() and not path.is_dir():
                raise HarnessError(
                    f"results folder '{self.root}' is damaged: '{path}' is a file where it keeps a folder"
                )

    def folder(self, kind: str, key: str) -> Path:
        """Where stage ``key`` of ``kind`` is (or would be) stored: a run at ``<root>/<key>``, any other stage at
        ``<root>/stages/<kind>/<key>``."""
        return self.root / key if kind == kinds.RUN else self.root / STAGES / kind / key

    def stage(self, kind: str, spec: dict) -> Stage:
        key = spec_hash(spec)
        return Stage(kind, spec, key, self.folder(kind, key), self.root)

    def at(self, kind: str, key: str) -> Stage:
        """Stage ``key`` of ``kind`` in this store, its spec not read (e.g. the train stage a run names)."""
        return Stage(kind, {}, key, self.folder(kind, key), self.root)

    def has_stages(self) -> bool:
        """Whether a stage other than a run was ever stored here (e.g. a trained watermark)."""
        return (self.root / STAGES).is_dir()

    def matching(self, prefix: str) -> list[Stage]:
        """The stages whose hash starts with ``prefix`` (hexadecimal: it is read as a glob pattern), specs not read:
        the folders of every kind but runs (by kind, then hash), then the finished runs (by hash)."""
        found = sorted(
            p for p in (self.root / STAGES).glob(f"*/{prefix}*") if p.is_dir() and files.plain_name(p.name) == p.name
        )
        runs = sorted(p for p in self.root.glob(f"{prefix}*") if (p / "DONE").exists())
        return [stage_at(p) for p in found] + [self.at(kinds.RUN, p.name) for p in runs]

    def build_or_reuse(self, stage: Stage, what: str, fn: Callable[[Path], dict], collective: bool = False) -> bool:
        """Build ``stage`` unless a verified copy is stored; return whether it was reused (and say so). A damaged
        copy is set aside and rebuilt; an edited one raises ``EditedStage``. One process builds, others wait.

        Under a launcher with several processes (harness/compute/distributed.py) the main process decides and publishes:
        a ``collective`` stage's ``fn`` runs in every process (the others write into a scratch folder that is dropped),
        any other stage is built by the main process alone while the others wait."""
        main = distributed.is_main()  # one process alone is its own main process
        with files.locked(stage.lock_file, f"{what} ({stage.key})") if main else contextlib.nullcontext():
            if distributed.broadcast(self._reusable(stage, what) if main else None):
                return True
            if collective and not main:
                with tempfile.TemporaryDirectory(prefix="harness-scratch-") as scratch:
                    fn(Path(scratch))
            elif main:
                with contextlib.nullcontext() if collective else distributed.solo():
                    stage.build(fn)
            # A failure in any process ends the command (the launcher stops the others), so this is not left waiting.
            distributed.barrier()
            return False

    def _reusable(self, stage: Stage, what: str) -> bool:
        """Whether ``stage`` is stored and verified; a damaged copy is set aside (call while holding its lock)."""
        if stage.done:
            problem = stage.problem()
            if problem is None:
                log.info("reusing %s %s (%s)", what, stage.key, stage.path)
                return True
            moved = self.set_aside(stage.path)
            log.warning(
                "stored %s %s is damaged (%s): moved to %s and computing it again", what, stage.key, problem, moved
            )
        files.remove_partials(stage.path)
        log.info("computing %s %s", what, stage.key)
        return False

    def set_aside(self, folder: Path) -> Path:
        return set_aside(self.root, folder)

    def sweep(self) -> int:
        """Remove the temporary folders of processes that died (SIGKILL, power loss); live builds keep theirs."""
        removed = 0
        for parent in [self.root, *sorted((self.root / STAGES).glob("*"))]:
            kind = kinds.RUN if parent == self.root else parent.name
            removed += files.sweep_partials(parent, lambda key, k=kind: lock_file(self.root, k, key))
        files.sweep_hash_index_leftovers()
        if removed:
            log.info("removed %d unfinished folders left by interrupted runs", removed)
        return removed

    def part_holding(self, path: Path) -> str | None:
        """What part of this store ``path`` is or lies in, for refusing to write there: the store itself, one of its
        runs or its stages (what the store reads as results); None elsewhere (a new folder beside the runs too)."""
        try:
            rel = Path(path).resolve().relative_to(self.root.resolve())
        except ValueError:
            return None
        if not rel.parts:
            return f"the run store '{self.root}' itself"
        head = rel.parts[0]
        if head in (STAGES, LOCKS) or (self.root / head / "spec.json").exists() or (self.root / head / "DONE").exists():
            return f"'{self.root / head}', a part of the run store '{self.root}'"
        return None

    def runs(self) -> list[Path]:
        """Finished run folders, oldest first."""
        found = [p for p in _finished(self.root.glob("*/DONE")) if p.parent.name not in (STAGES, DAMAGED)]
        return [p.parent for p in sorted(found, key=lambda p: p.stat().st_mtime)]

    def attributions(self) -> list[Path]:
        """Finished attribution stage folders, by hash."""
        return [p.parent for p in sorted(_finished((self.root / STAGES / kinds.ATTRIBUTION).glob("*/DONE")))]

    def results(self) -> list[Stage]:
        """What tables and reports read: the finished runs (oldest first), then the attribution stages."""
        return [self.at(kinds.RUN, p.name) for p in self.runs()] + [
            self.at(kinds.ATTRIBUTION, p.name) for p in self.attributions()
        ]

    def finished(self) -> list[Stage]:
        """Every finished stage, specs not read: those of every kind but runs (by kind, then hash), then the runs
        (oldest first)."""
        return [stage_at(p.parent) for p in sorted(_finished((self.root / STAGES).glob("*/*/DONE")))] + [
            self.at(kinds.RUN, p.name) for p in self.runs()
        ]


def _finished(markers) -> list[Path]:
    """The ``DONE`` files of ``markers`` that mark a published stage, not one in the temporary ``.<hash>.partial-*``
    folder of a build or an export that was killed (pathlib's glob finds hidden folders too)."""
    return [p for p in markers if not p.parent.name.startswith(".")]


def stage_at(folder: Path) -> Stage:
    """The stage stored in ``folder``, its spec not read, told by where the folder lies: a stage of kind ``<kind>``
    in ``<root>/stages/<kind>/``, else a run of the store that holds it (``folder.parent``)."""
    folder = Path(folder)
    if folder.parent.parent.name == STAGES:
        return Stage(folder.parent.name, {}, folder.name, folder, folder.parent.parent.parent)
    return Stage(kinds.RUN, {}, folder.name, folder, folder.parent)
