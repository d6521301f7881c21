"""A store's results without its bulk: ``harness export`` copies every finished run, attribution and calibration
stage that verifies into another store, leaving out the generated texts (``generations.jsonl``, about 85% of a run
folder), so that a grid's results can be committed or mailed and still be read by ``harness tables`` and ``harness
report``.

Each copied folder keeps its name (the hash of its spec), spec, scores and metrics byte for byte; its
``manifest.json`` gains ``exported_without`` (the files left out) and its ``contents.json`` is published anew for what
it holds, so the copy verifies like any stage. Trained and attacked models, generations and other stages are not
copied: an exported store cannot be rescored or extended, only read.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

from harness.config.errors import HarnessError
from harness.store import files, kinds
from harness.store.stages import CONTENTS, LOCKS, EditedStage, Store, contents, lock_file

log = logging.getLogger(__name__)

TEXTS = "generations.jsonl"
EXPORTED = "exported_without"


def export(store: Store, dest: Path, keep_texts: bool = False, only: set[str] | None = None) -> tuple[int, list[str]]:
    """Copy ``store``'s runs and attribution stages into the store at ``dest`` (made if missing; stages already there
    are replaced); ``only``: of those, the stages with these hashes (a grid's runs). Returns (copied, the ones left out
    because they do not verify, each with its reason).

    Each stage is copied into a temporary sibling (``.<hash>.partial-<host>-<pid>``, never read as a stage), its
    ``DONE`` written last, and renamed into place, under the destination's lock for that stage, so an export killed
    midway leaves no folder that reads as finished; what it left is removed by the next export (``Store.sweep``). One
    export at a time writes into ``dest``: a second is refused in one line while the first runs."""
    dest = Path(dest)
    if dest.resolve() == store.root.resolve() or store.root.resolve() in dest.resolve().parents:
        raise HarnessError(f"cannot export the store '{store.root}' into itself ('{dest}' is inside it)")
    files.check_writable(dest, "export folder")
    into = Store(dest)
    if dest.is_dir() and any(dest.iterdir()) and not (into.has_stages() or (dest / LOCKS).is_dir() or into.runs()):
        raise HarnessError(f"'{dest}' is neither empty nor a run store: export into a new or empty folder, or a store")
    (dest / LOCKS).mkdir(exist_ok=True)
    held = files.try_lock(dest / LOCKS / "export.lock")
    if held is None:
        raise HarnessError(f"another 'harness export' is writing into '{dest}': run this one once it has finished")
    try:
        into.sweep()  # the temporary folders of exports (and builds) that were killed
        return _copy_all(store, into, keep_texts, only)
    finally:
        held.release()


def _copy_all(store: Store, into: Store, keep_texts: bool, only: set[str] | None) -> tuple[int, list[str]]:
    left_out, copied = [], 0
    drop = () if keep_texts else (TEXTS,)
    calibrations = [stage for stage in store.finished() if stage.kind == kinds.CALIBRATION]  # (the matched tables')
    for stage in store.results() + calibrations:
        if only is not None and stage.key not in only:
            continue
        try:
            problem = stage.problem()
        except EditedStage as err:
            problem = str(err)
        if problem is not None:
            left_out.append(f"{stage.path}: {problem}")
            log.warning("not exported: %s: %s", stage.path, problem)
            continue
        target = into.folder(stage.kind, stage.key)
        with files.locked(lock_file(into.root, stage.kind, stage.key), f"the export of {stage.key}"):
            _copy(stage.path, target, drop)
        copied += 1
    return copied, left_out


def _copy(source: Path, target: Path, drop: tuple[str, ...]) -> None:
    """Publish a copy of the stage folder ``source`` at ``target``, less the files ``drop``: built whole under a
    temporary name, ``contents.json`` then ``DONE`` written last, then renamed into place (call holding its lock)."""
    files.remove_partials(target)
    partial = target.with_name(f".{target.name}.partial-{files.owner_tag()}")
    try:
        shutil.copytree(source, partial, ignore=shutil.ignore_patterns(*drop, "DONE", CONTENTS))
        dropped = [name for name in drop if (source / name).exists()]
        if dropped:
            manifest = json.loads((partial / "manifest.json").read_text())
            manifest[EXPORTED] = dropped
            (partial / "manifest.json").write_text(json.dumps(manifest, indent=2))
        (partial / CONTENTS).write_text(json.dumps(contents(partial), indent=1, sort_keys=True))
        (partial / "DONE").write_text("")
        if target.exists():
            shutil.rmtree(target)
        target.parent.mkdir(parents=True, exist_ok=True)
        partial.rename(target)
    except OSError as err:
        raise HarnessError(f"cannot export '{source}' to '{target}': {err.strerror or err}") from None
    finally:
        shutil.rmtree(partial, ignore_errors=True)


def exported_without(folder: Path) -> list[str]:
    """The files ``harness export`` left out of this stage folder (none for a stage as it was built)."""
    try:
        return list(json.loads((Path(folder) / "manifest.json").read_text()).get(EXPORTED, []))
    except (OSError, ValueError, AttributeError):
        return []
