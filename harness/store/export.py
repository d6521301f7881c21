"""A store's results without its bulk: ``harness export`` copies every finished run and attribution stage that
verifies into another store, leaving out the generated texts (``generations.jsonl``, about 85% of a run folder), so
that a grid's results can be committed or mailed and still be read by ``harness tables`` and ``harness report``.

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
from harness.store import files
from harness.store.stages import CONTENTS, EditedStage, Store, contents

log = logging.getLogger(__name__)

TEXTS = "generations.jsonl"
EXPORTED = "exported_without"


def export(store: Store, dest: Path, keep_texts: bool = False) -> tuple[int, list[str]]:
    """Copy ``store``'s runs and attribution stages into the store at ``dest`` (made if missing; stages already there
    are replaced). Returns (copied, the ones left out because they do not verify, each with its reason)."""
    dest = Path(dest)
    if dest.resolve() == store.root.resolve():
        raise HarnessError(f"cannot export the store '{store.root}' into itself")
    files.check_writable(dest, "export folder")
    left_out, copied = [], 0
    drop = () if keep_texts else (TEXTS,)
    for stage in store.results():
        try:
            problem = stage.problem()
        except EditedStage as err:
            problem = str(err)
        if problem is not None:
            left_out.append(f"{stage.path}: {problem}")
            log.warning("not exported: %s: %s", stage.path, problem)
            continue
        target = dest / stage.path.relative_to(store.root)
        partial = target.with_name(f".{target.name}.partial-{files.owner_tag()}")
        shutil.rmtree(partial, ignore_errors=True)
        shutil.copytree(stage.path, partial, ignore=shutil.ignore_patterns(*drop))
        dropped = [name for name in drop if (stage.path / name).exists()]
        if dropped:
            manifest = json.loads((partial / "manifest.json").read_text())
            manifest[EXPORTED] = dropped
            (partial / "manifest.json").write_text(json.dumps(manifest, indent=2))
        (partial / CONTENTS).write_text(json.dumps(contents(partial), indent=1, sort_keys=True))
        if target.exists():
            shutil.rmtree(target)
        target.parent.mkdir(parents=True, exist_ok=True)
        partial.rename(target)
        copied += 1
    return copied, left_out


def exported_without(folder: Path) -> list[str]:
    """The files ``harness export`` left out of this stage folder (none for a stage as it was built)."""
    try:
        return list(json.loads((Path(folder) / "manifest.json").read_text()).get(EXPORTED, []))
    except (OSError, ValueError, AttributeError):
        return []
