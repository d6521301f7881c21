"""Where a whole grid's time goes: run a grid spec into an empty store with a fresh cache, then print the wall time of
each kind of work, read from the stage manifests the run store keeps.

    python benchmarks/grid.py [SPEC] [--results DIR] [--cache DIR] [--json FILE] [-- GRID OPTIONS ...]
    python benchmarks/grid.py --read STORE [--cache DIR]      # the same table for a store that exists

SPEC defaults to grids/tiny.yaml (90 cells, 19 trainings; 114 minutes of stages on 2 AVX2 cores from empty, plus
the tiny paraphraser's build). The store defaults to a new folder under the system's temp folder (kept, and named at
the end) and the cache to a new one beside it, so nothing built earlier is reused; ``--cache ~/.cache/harness``
keeps the built-in models that are already built (their build is then not part of the figures). Options after ``--``
go to ``harness grid`` (e.g. ``-- --executor local``).

Rows, from each stage's ``manifest.json`` (``seconds``, the time its build took):
- trainings by method; a method's own stages (e.g. Gu-KTH's teacher texts, Gloaguen-KGW's first fine-tuning) apart,
  and not counted again in the training that built them;
- model attacks by the category their rows go in (Quantization, Pruning, Merging, Finetuning), text attacks by name
  (DIPPER's rewrites, the text edits);
- generation, scoring (the detectors on generated and human texts, and perplexity), attribution, detection audits;
- built-in models built in the cache (the tiny LM, the tiny paraphraser: from their ``build.json``), not counted
  again in the stage that needed them;
- ``harness tables``, timed around the command;
- the rest of the wall time: process start-up, model loading outside stages, checks and reuse.

A stage built inside another one (its time interval lies within the other's) is subtracted from the outer stage, so
the rows add up to the wall time. That holds for one process (the default, inline executor); with parallel jobs
the stages overlap and the rows add up to more than the wall time.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
CACHE = "cache"  # the kind this table gives the built-in models built in the cache (not a stage of the store)


def _harness() -> list[str]:
    """The installed console script beside this interpreter, else ``python -m harness``."""
    script = Path(sys.executable).with_name("harness")
    return [str(script)] if script.exists() else [sys.executable, "-m", "harness"]


def _started(manifest: dict) -> float | None:
    try:
        return datetime.strptime(manifest["started"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()
    except (KeyError, ValueError):
        return None


def stages(store: Path) -> list[dict]:
    """Every finished stage of ``store`` (run folders included) as ``{kind, spec, start, seconds}``."""
    from harness.store.stages import Store

    found = []
    for stage in Store(store).finished():
        try:
            manifest = stage.manifest()
            spec = json.loads((stage.path / "spec.json").read_text())
        except (OSError, ValueError):
            continue
        kind = manifest["kind"]
        found.append({"kind": kind, "spec": spec, "start": _started(manifest), "seconds": manifest.get("seconds", 0)})
    return found


def exclusive(found: list[dict]) -> list[float]:
    """Each stage's seconds less those of the stages built inside it (directly: the largest contained ones). A
    manifest's start is whole seconds, so containment allows one second of slack."""
    spans = [(s["start"], s["start"] + s["seconds"]) if s["start"] is not None else None for s in found]
    parent = [None] * len(found)
    for i, inner in enumerate(spans):
        if inner is None:
            continue
        best = None
        for j, outer in enumerate(spans):
            if j == i or outer is None or found[j]["seconds"] <= found[i]["seconds"]:
                continue
            if outer[0] - 1 <= inner[0] and inner[1] <= outer[1] + 1:
                if best is None or found[j]["seconds"] < found[best]["seconds"]:
                    best = j
        parent[i] = best
    own = [float(s["seconds"]) for s in found]
    for i, p in enumerate(parent):
        if p is not None:
            own[p] -= found[i]["seconds"]
    return [max(0.0, x) for x in own]


def category(attack: str) -> str:
    """The row group an attack's rows go in (its plugin's ``category``), or its name where it cannot be loaded."""
    from harness.config import registry

    try:
        return registry.attacks.load(attack).category
    except Exception:  # an outside plugin no longer installed: name it
        return attack


def group(stage: dict) -> str:
    from harness.store import kinds

    kind, spec = stage["kind"], stage["spec"]
    if kind == kinds.TRAIN:
        return f"training: {spec.get('method', '?')}"
    if kind == kinds.ATTACK:
        return f"model attack: {category(spec.get('attack', '?'))}"
    if kind == kinds.TEXT_ATTACK:
        return f"text attack: {spec.get('attack', '?')}"
    if kind == kinds.GENERATE:
        return "generation"
    if kind == kinds.RUN:
        return "scoring (detector and perplexity)"
    if kind == CACHE:
        return f"built-in model: {spec['name']}"
    if kind in kinds.RESERVED:
        return kind
    return f"method's own stage: {kind}"


def cache_builds(cache: Path) -> list[dict]:
    """The built-in models built in ``cache``, as stages of kind ``cache`` (``build.json`` records their seconds and
    is written last, so its time of change ends the interval)."""
    out = []
    for built in sorted(cache.glob("*/build.json")):
        try:
            record = json.loads(built.read_text())
        except (OSError, ValueError):
            continue
        seconds = record.get("build_seconds", record.get("seconds"))  # the whole build, not its last stage
        if isinstance(seconds, (int, float)):
            name = built.parent.name.rsplit("-", 1)[0]
            out.append({"kind": CACHE, "spec": {"name": name}, "start": built.stat().st_mtime - seconds,
                        "seconds": float(seconds)})  # fmt: skip
    return out


def breakdown(
    store: Path, cache: Path | None, wall: float | None, tables: float | None
) -> list[tuple[str, int, float]]:
    """``(row, count, seconds)`` rows, largest first, then tables and the rest of the wall time."""
    found = stages(store) + (cache_builds(cache) if cache else [])
    rows: dict[str, list[float]] = {}
    for stage, own in zip(found, exclusive(found), strict=True):
        rows.setdefault(group(stage), []).append(own)
    out = sorted(((name, len(v), sum(v)) for name, v in rows.items()), key=lambda r: -r[2])
    if tables is not None:
        out.append(("harness tables", 1, tables))
    if wall is not None:
        rest = wall + (tables or 0) - sum(r[2] for r in out)
        out.append(("the rest (start-up, loading, checks, reuse)", 0, max(0.0, rest)))
    return out


def render(rows: list[tuple[str, int, float]], wall: float | None) -> str:
    total = (wall if wall is not None else sum(r[2] for r in rows)) or 1.0
    width = max(len(r[0]) for r in rows) if rows else 10
    lines = [f"{'work':<{width}}  {'count':>5}  {'minutes':>8}  {'share':>6}", "-" * (width + 25)]
    for name, count, seconds in rows:
        lines.append(f"{name:<{width}}  {count or '':>5}  {seconds / 60:>8.1f}  {seconds / total:>6.1%}")
    lines.append("-" * (width + 25))
    lines.append(f"{'wall time' if wall is not None else 'sum of stages':<{width}}  {'':>5}  {total / 60:>8.1f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("spec", nargs="?", default=str(ROOT / "grids" / "tiny.yaml"), help="grid spec (grids/tiny.yaml)")
    ap.add_argument("--results", type=Path, help="an empty store to run into (default: a new temp folder)")
    ap.add_argument("--cache", type=Path, help="HARNESS_CACHE for the run (default: a new, empty one)")
    ap.add_argument("--read", type=Path, metavar="STORE", help="only print the table of a store that exists")
    ap.add_argument("--json", type=Path, help="also write the rows to this file")
    args = ap.parse_args(argv)

    wall = tables = None
    if args.read:
        store = args.read
        if not store.is_dir():
            ap.error(f"--read: no store at '{store}'")
    else:
        work = Path(tempfile.mkdtemp(prefix="harness-grid-bench-"))
        store = args.results or work / "runs"
        if store.exists() and any(store.iterdir()):
            ap.error(f"--results '{store}' is not empty: the benchmark measures a grid from an empty store")
        cache = args.cache or work / "cache"
        env = {**os.environ, "HARNESS_CACHE": str(cache)}
        command = [*_harness(), "grid", args.spec, "--results", str(store), *extra]
        print("$ HARNESS_CACHE=" + str(cache), " ".join(command), flush=True)
        start = time.perf_counter()
        grid = subprocess.run(command, env=env)
        wall = time.perf_counter() - start
        start = time.perf_counter()
        subprocess.run([*_harness(), "tables", "--results", str(store), "--out", str(work / "tables")], env=env,
                       check=False, stdout=subprocess.DEVNULL)  # fmt: skip
        tables = time.perf_counter() - start
        args.cache = cache
        if grid.returncode != 0:
            print(f"harness grid exited {grid.returncode}: the figures below cover what it finished", flush=True)
    rows = breakdown(store, args.cache, wall, tables)
    print(f"\nstore: {store}" + (f"   cache: {args.cache}" if args.cache else ""))
    print(f"{os.cpu_count()} cores; {'wall time of grid + tables' if wall is not None else 'stages as recorded'}\n")
    print(render(rows, None if wall is None else wall + tables))
    if args.json:
        rows_json = [{"work": n, "count": c, "seconds": round(s, 1)} for n, c, s in rows]
        args.json.write_text(json.dumps({"store": str(store), "wall_seconds": wall, "rows": rows_json}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
