"""Files the harness writes and trusts: content hashes (cached, so a 16 GB checkpoint is read once), folders
published atomically under a lock, files replaced whole (``replacing``: tables, figures, the report, the hash index),
and the clean-up of what a killed process left half-written."""

from __future__ import annotations

import errno
import glob
import hashlib
import json
import logging
import os
import re
import secrets
import shutil
import socket
import stat
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

from harness.compute import memory
from harness.config.errors import HarnessError, first_line
from harness.store.versions import machine  # a build records the processor: its float bits depend on it

log = logging.getLogger(__name__)

SMALL_FILE = 1 << 20  # files below this are hashed directly; larger ones go through the hash index


def cache_root() -> Path:
    """Where built models and file hashes are kept between runs: ``$HARNESS_CACHE``, default ``~/.cache/harness``."""
    # (set but empty is unset: an empty path is the working directory, which would fill with the cache's folders)
    return Path(os.environ.get("HARNESS_CACHE") or Path.home() / ".cache" / "harness").expanduser()


def check_cache() -> None:
    """One line, before any work, when the cache cannot be used: ``$HARNESS_CACHE`` (or a folder above it) is a file,
    or the folder that would hold it cannot be written. Creates nothing (a dry run writes nothing into the cache)."""
    root = cache_root()
    for path in (root, *root.parents):
        if not path.exists():
            continue
        if not path.is_dir():
            where = "it is a file, not a folder" if path == root else f"'{path}' is a file"
            raise HarnessError(f"the cache '{root}' ($HARNESS_CACHE) is not usable: {where}")
        if not os.access(path, os.W_OK | os.X_OK):
            raise HarnessError(f"the cache '{root}' ($HARNESS_CACHE) is not usable: '{path}' is not writable")
        return


def _sha256(file: Path) -> str:
    digest = hashlib.sha256()
    with file.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 24), b""):
            digest.update(block)
    return digest.hexdigest()


def file_sha256(file: Path) -> str:
    """sha256 of a file. Large files' hashes are remembered in ``$HARNESS_CACHE/file-hashes.json`` under their
    device, inode, size and modification time, so a checkpoint is read once, and once more after any change (a
    rename keeps the entry; an edit that restores size and mtime by hand would not be seen)."""
    file = Path(file)
    stat = file.stat()
    if stat.st_size < SMALL_FILE:
        return _sha256(file)
    key = f"{stat.st_dev}:{stat.st_ino}|{stat.st_size}|{stat.st_mtime_ns}"
    index = cache_root() / "file-hashes.json"
    try:
        known = json.loads(index.read_text())
    except (OSError, ValueError):  # absent, or damaged by a crash mid-write: start again
        known = {}
    if key not in known:
        known[key] = _sha256(file)
        index.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(index, json.dumps(known))
    return known[key]


PLAIN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")


def plain_name(name: str) -> str:
    """``name`` as one path component that stays inside its folder: kept when it is plain (letters, digits, ``.``,
    ``_``, ``-``; no separator, no ``..``), else its plain characters and a hash of it (``tiny-..-x`` ->
    ``tiny-x-1a2b3c4d``), so that a name read from a store or a plugin never writes outside the folder asked for."""
    if PLAIN_NAME.fullmatch(name) and ".." not in name:
        return name
    kept = re.sub(r"[^A-Za-z0-9_-]+", "-", name).strip("-")[:60] or "name"
    return f"{kept}-{hashlib.sha256(name.encode()).hexdigest()[:8]}"


def stays_inside(rel: str) -> bool:
    """Whether the relative path ``rel`` names something inside the folder it is joined to: not absolute, not empty,
    no ``..``."""
    path = Path(rel)
    return bool(path.parts) and not path.is_absolute() and ".." not in path.parts


def check_writable(folder: Path, what: str, create: bool = True) -> None:
    """Make ``folder`` (and its parents) or fail in one line naming ``what`` it is, before any work: a file where a
    folder should be, or a folder this process cannot write to. ``create=False`` (a dry run) makes nothing: the
    folder, or the nearest of its parents that exists, must be one this process may write in."""
    folder = Path(folder)
    for path in (folder, *folder.parents):
        if path.exists() and not path.is_dir():
            where = "it is a file, not a folder" if path == folder else f"'{path}' is a file"
            raise HarnessError(f"{what} '{folder}' is not writable: {where}")
    if not create:
        nearest = next(p for p in (folder.absolute(), *folder.absolute().parents) if p.exists())
        if not os.access(nearest, os.W_OK | os.X_OK):  # (a read-only mount or an immutable folder, for root too)
            raise HarnessError(f"{what} '{folder}' is not writable: '{nearest}' is not writable by this process")
        return
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / f".write-test-{os.getpid()}"
        probe.write_text("")
        probe.unlink()
    except OSError as err:
        raise HarnessError(f"{what} '{folder}' is not writable: {err.strerror or err}") from None


@contextmanager
def replacing(file: Path) -> Iterator[BinaryIO]:
    """Write ``file`` anew, all at once, through the binary handle this yields. The bytes go to a temporary file
    beside it (same folder, so the rename is atomic; a name of its own per call, ``.<name>.<random>.partial-<host>-
    <pid>``, so two writers never share one), which is fsync'd (a full disk fails here, not after) and renamed over
    ``file`` when the block ends. If the block raises, the temporary file is removed and ``file`` is as it was; a
    killed process leaves only a temporary file, which the next write of ``file`` removes. A replaced file keeps its
    permission bits, as one written in place would."""
    file = Path(file)
    for leftover in file.parent.glob(f".{glob.escape(file.name)}.*partial-*"):
        if leftover.is_file() and not _owner_alive(leftover.name):
            leftover.unlink(missing_ok=True)
    tmp = file.with_name(f".{file.name}.{secrets.token_hex(4)}.partial-{owner_tag()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # (the umask applies, as to any new file)
    try:
        with os.fdopen(fd, "wb") as fh:
            yield fh
            fh.flush()
            if file.exists():
                os.fchmod(fh.fileno(), stat.S_IMODE(file.stat().st_mode))
            os.fsync(fh.fileno())
        os.replace(tmp, file)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_atomic(file: Path, data: str | bytes) -> None:
    """Replace ``file`` by ``data`` (text is written as UTF-8) all at once (``replacing``), so a reader, a crash or
    a full disk never leaves half of it."""
    with replacing(file) as fh:
        fh.write(data.encode("utf-8") if isinstance(data, str) else data)


def read_bounded(path: Path, what: str, limit: int) -> str:
    """The UTF-8 text of the file ``path`` that a user gave (``what`` it is, for messages), read no further than
    ``limit`` bytes (a device such as /dev/zero never ends): anything else is one line naming the file."""
    path = Path(path)
    if not path.exists():
        raise HarnessError(f"{what} '{path}' does not exist")
    if not path.is_file():  # a folder; a FIFO or a device would block, or never end
        raise HarnessError(f"{what} '{path}' is not a regular file")
    try:
        with path.open("rb") as fh:
            data = fh.read(limit + 1)
        if len(data) > limit:
            size = f"{limit >> 20} MiB" if limit >= 1 << 20 else f"{limit >> 10} KiB"
            raise HarnessError(f"{what} '{path}' is larger than {size}; split it")
        return data.decode("utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise HarnessError(f"cannot read {what} '{path}': {getattr(err, 'strerror', None) or err}") from None


_SURROGATE = re.compile("[\ud800-\udfff]")


def check_surrogates(value, where: str) -> None:
    """One line starting with ``where`` if a string in the parsed JSON or YAML ``value`` holds a lone surrogate
    (``"\\ud800"``: both escape it; no UTF-8 text holds it, and writing it out fails later)."""
    found = _SURROGATE.search(json.dumps(value, ensure_ascii=False, default=str))
    if found:
        raise HarnessError(f"{where}: a lone surrogate (\\u{ord(found.group()):04x}), which no UTF-8 text holds")


def parse_json(text: str | bytes, where: str, finite: bool = False):
    """``text`` parsed as JSON, or one line starting with ``where`` (a file, a file and line) when it is not JSON, is
    nested too deeply to read (Python's parser recurses), or holds a lone surrogate (``check_surrogates``).
    ``finite``: NaN and Infinity, which Python writes and reads but JSON has not, are refused too (a model config
    holding them is a model that computes NaN)."""

    def constant(name: str):
        raise ValueError(f"{name} is not a JSON value")

    try:
        value = json.loads(text, **({"parse_constant": constant} if finite else {}))
        if (b"\\u" if isinstance(text, bytes) else "\\u") in text:  # (only an escape makes one)
            check_surrogates(value, where)
    except RecursionError:
        raise HarnessError(f"{where}: nested too deeply to read") from None
    except ValueError as err:
        raise HarnessError(f"{where}: not JSON ({first_line(err)})") from None
    return value


def write_jsonl(file: Path, rows: list[dict]) -> None:
    with Path(file).open("w") as fh:
        for row in rows:
            fh.write(json.dumps(row) + "\n")


def read_jsonl(file: Path) -> list[dict]:
    return [json.loads(line) for line in Path(file).read_text().splitlines() if line]


def link(src: Path, dst: Path) -> None:
    """Hard-link ``src`` to ``dst`` (no copy of large files), copying where links are not possible."""
    try:
        os.link(src, dst)
    except OSError:
        shutil.copyfile(src, dst)


def _json(file: Path) -> None:
    json.loads(file.read_bytes())


def _jsonl(file: Path) -> None:
    with file.open("rb") as fh:
        for line in fh:
            if line.strip():
                json.loads(line)


def _safetensors(file: Path) -> None:
    """The header's length and tensor offsets must account for every byte of the file."""
    size = file.stat().st_size
    with file.open("rb") as fh:
        length = int.from_bytes(fh.read(8), "little")
        if length <= 0 or 8 + length > size:
            raise ValueError("header length past the end of the file")
        header = json.loads(fh.read(length))
    ends = [v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"]
    if 8 + length + max(ends, default=0) != size:
        raise ValueError("tensor data does not fill the file")


FORMATS = {".json": _json, ".jsonl": _jsonl, ".safetensors": _safetensors}


def unreadable(file: Path) -> str | None:
    """Why ``file`` does not read in its format (truncated, cut mid-write), or None if it reads."""
    try:
        FORMATS[file.suffix](file)
    except (OSError, ValueError, KeyError, TypeError, IndexError, AttributeError, RecursionError) as err:
        return f"not valid {file.suffix[1:]}: {type(err).__name__}"
    return None


def owner_tag() -> str:
    """``<host>-<pid>``: the suffix of temporary names, so that leftovers of a dead process can be told apart."""
    return f"{socket.gethostname()}-{os.getpid()}"


def _owner_alive(name: str) -> bool:
    """Whether the process that named a temporary ``...partial-<host>-<pid>`` may still be running."""
    host, _, pid = name.rpartition("partial-")[2].rpartition("-")
    if host != socket.gethostname() or not pid.isdigit():
        return True  # another machine's (shared file system) or unknown: leave it to its owner or its lock
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, someone else's
        pass
    return True


@contextmanager
def locked(lock_file: Path, what: str) -> Iterator[None]:
    """Hold an exclusive lock on ``lock_file`` (created as needed); say so when another process holds it first.
    The lock is released when the process ends, however it ends."""
    from filelock import FileLock, Timeout

    lock_file.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(lock_file))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        log.info("waiting for another process that is building %s", what)
        lock.acquire()
    try:
        yield
    finally:
        lock.release()


def is_built(folder: Path, ready_files: tuple[str, ...]) -> bool:
    """Whether ``build_once`` has published ``folder`` with ``ready_files`` (it would return it without building)."""
    return all((folder / f).exists() for f in (*ready_files, "DONE"))


def build_once(folder: Path, ready_files: tuple[str, ...], what: str, build: Callable[[Path], dict]) -> Path:
    """``folder`` (under the cache), building it first with ``build(partial_folder) -> report`` if this machine has
    none: one process builds while others wait on a lock beside it; the report goes to ``build.json``; the folder is
    published by rename only when complete (``DONE`` last), so an interrupted build leaves nothing behind."""
    ready = lambda: is_built(folder, ready_files)  # noqa: E731
    if ready():
        return folder
    with locked(folder.with_name(f"{folder.name}.lock"), what):
        if ready():  # built by the process we waited for
            return folder
        remove_partials(folder)
        if folder.exists():
            log.warning("the cached %s in %s is incomplete; building it again", what, folder)
            shutil.rmtree(folder)
        log.info("building %s once for this machine in %s", what, folder)
        partial = folder.with_name(f".{folder.name}.partial-{owner_tag()}")
        partial.mkdir(parents=True)
        try:
            report = build(partial)
            (partial / "build.json").write_text(json.dumps({**report, "machine": machine()}, indent=2))
            (partial / "DONE").write_text("")
            partial.rename(folder)
        finally:
            shutil.rmtree(partial, ignore_errors=True)
            memory.release()  # the build's tensors are gone: their memory goes back, as after a stage
    return folder


def try_lock(lock_file: Path):
    """The lock on ``lock_file`` if it is free now (the caller releases it), else None."""
    from filelock import FileLock, Timeout

    lock = FileLock(str(lock_file))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        return None
    return lock


def remove_partials(folder: Path) -> None:
    """Delete the temporary ``.<name>.partial-*`` siblings of ``folder``; call only while holding its lock: then no
    live process can be writing them."""
    for partial in folder.parent.glob(f".{folder.name}.partial-*"):
        log.info("removing %s, left by an interrupted process", partial)
        shutil.rmtree(partial, ignore_errors=True)


def sweep_partials(parent: Path, lock_for) -> int:
    """Delete every ``.<name>.partial-*`` folder under ``parent`` whose owner is gone: its lock
    (``lock_for(name)``) is free. Returns how many were removed."""
    removed = 0
    for partial in parent.glob(".*.partial-*"):
        name = partial.name[1:].partition(".partial-")[0]
        lock = try_lock(lock_for(name))
        if lock is None:
            continue
        try:
            if partial.exists():
                shutil.rmtree(partial, ignore_errors=True)
                removed += 1
        finally:
            lock.release()
    return removed


def sweep_hash_index_leftovers() -> None:
    """Temporary copies of the hash index written by processes that died mid-write."""
    leftovers = [*cache_root().glob(".file-hashes.json.*partial-*"), *cache_root().glob("file-hashes.json.partial-*")]
    for tmp in leftovers:
        if not _owner_alive(tmp.name):
            tmp.unlink(missing_ok=True)


# errno values of a write that found no room: no space left, a file past the size limit, a quota reached
DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EFBIG, errno.EDQUOT)
DISK_FULL_WORDS = ("No space left on device", "File too large", "Disk quota exceeded", "FileTooLarge", "StorageFull")


def disk_full(err: BaseException) -> bool:
    """Whether ``err`` is a write that found no room: an ``OSError`` of ``DISK_FULL_ERRNOS``, or a library's own error
    that carries one (safetensors raises its Rust IoError as text: ``IoError(Os { code: 27, kind: FileTooLarge,
    ... })``)."""
    if isinstance(err, OSError) and err.errno in DISK_FULL_ERRNOS:
        return True
    return any(word in str(err) for word in DISK_FULL_WORDS)


def folder_bytes(folder: Path) -> int:
    """Bytes held by the files under ``folder`` (0 where it is gone)."""
    try:
        return sum(p.stat().st_size for p in Path(folder).rglob("*") if p.is_file())
    except OSError:
        return 0
