"""How this process gets memory for large tensors on a CPU.

glibc serves every allocation above ``M_MMAP_THRESHOLD`` (at most 32 MB, however it adapts) with a fresh ``mmap``
and gives it back with ``munmap`` when freed. A CPU training step allocates and frees dozens of tensors the size of
the logits (B x T x V floats: 16 x 128 x 4,096 is 33.5 MB on the tiny preset), so each one is page-faulted and
zeroed by the kernel again, one 4 KB page at a time: an element-wise op over the logits then costs 2-3x what the
arithmetic does. Raising the mmap threshold keeps freed blocks in the heap for the next tensor of that size. It changes
where tensors live, never what is computed: results are bit-identical (``tests/unit/test_memory.py``).

glibc also gives free memory at the heap's top back to the system as soon as it passes the trim threshold, all of it,
and the next step faults it in again. A CAWP step at SmolLM2-135M's 49,152-token vocabulary frees more than the 1 GiB
that was kept: its policy update (M's part of the step) took 3.5 s with those faults and 2.8 s without them
(benchmarks/README.md). So the heap is never trimmed while a stage works. Between stages (``release``, after each stage
a pipeline builds or reuses) the free memory goes back to the system if more than 1 GiB of it is free.

PyTorch's tuning guide gets the same effect by preloading jemalloc or tcmalloc; a ``mallopt`` call in the process
does it with nothing to install. Written by hand because no maintained library makes that call. On a system
without glibc it does nothing; ``HARNESS_MALLOC=system`` leaves glibc as it is.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import logging
import os

log = logging.getLogger(__name__)

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
# Blocks up to 1 GiB come from the heap (a 128,256-token vocabulary's logits for a 512 x 2 batch are 0.5 GB); free
# heap is never given back by free() (-1: glibc's "no trimming"), only by ``release`` when more than KEEP is free.
MMAP_THRESHOLD = 1 << 30
TRIM_THRESHOLD = -1
KEEP = 1 << 30


class _MallInfo2(ctypes.Structure):  # glibc >= 2.33
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]  # fmt: skip


_done: bool | None = None


@functools.cache
def _libc():
    """The C library (glibc's functions are looked up on it), or None where it cannot be loaded."""
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None


MALLOC_SETTINGS = ("", "system")  # HARNESS_MALLOC: unset (the harness's thresholds) or glibc's own defaults


def check_setting() -> None:
    """One line where ``HARNESS_MALLOC`` holds a value the harness does not know (a typo of ``system`` would
    otherwise leave the tuned allocator in place in silence)."""
    from harness.config.errors import HarnessError

    value = os.environ.get("HARNESS_MALLOC", "")
    if value.lower() not in MALLOC_SETTINGS:
        raise HarnessError(
            f"HARNESS_MALLOC={value!r} is not a setting: leave it unset, or 'system' for glibc's defaults"
        )


def tune_allocator() -> bool:
    """Raise glibc's mmap threshold and turn its trimming off for this process (once); return whether both took."""
    global _done
    if _done is not None:
        return _done
    _done = False
    if os.environ.get("HARNESS_MALLOC", "").lower() == "system":
        return False
    mallopt = getattr(_libc(), "mallopt", None)
    if mallopt is None:  # not glibc (macOS, musl without mallopt): nothing to tune
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    # Some glibc versions refuse an mmap threshold above 32 MB (half their largest heap): that one then.
    raised = any(mallopt(M_MMAP_THRESHOLD, value) for value in (MMAP_THRESHOLD, 32 << 20))
    _done = raised and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
    if not _done:
        log.debug("mallopt refused the thresholds; glibc's defaults stay")
    return _done


def free_heap() -> int | None:
    """Bytes free in glibc's heap (``mallinfo2().fordblks``: kept, not given back); None before glibc 2.33."""
    mallinfo2 = getattr(_libc(), "mallinfo2", None)
    if mallinfo2 is None:
        return None
    mallinfo2.argtypes, mallinfo2.restype = (), _MallInfo2
    return mallinfo2().fordblks


def release() -> bool:
    """Between stages: give the heap's free memory back to the system (``malloc_trim``) if more than ``KEEP`` of it is
    free and ``tune_allocator`` turned glibc's own trimming off; return whether it did."""
    if not _done:
        return False
    free = free_heap()
    if free is not None and free <= KEEP:
        return False
    malloc_trim = _libc().malloc_trim  # glibc: tune_allocator's mallopt calls succeeded
    malloc_trim.argtypes, malloc_trim.restype = (ctypes.c_size_t,), ctypes.c_int
    malloc_trim(0)
    return True


# A stage's peak memory, for its manifest. Linux keeps a process's resident high-water mark (VmHWM) and resets it to
# the current size when "5" is written to /proc/self/clear_refs, so a stage's peak is read without sampling; stages
# built inside another stage's build (a conversion inside a training) fold their peak into the enclosing one's.
# Written by hand: psutil reads VmHWM (as ``peak_wset`` on Windows only) but cannot reset it.
_enclosing: list[dict] = []


def _rss_peak() -> int | None:
    """This process's resident high-water mark in bytes since it was last reset, or None off Linux."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _reset_rss_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as clear:
            clear.write("5")
        return True
    except OSError:
        return False


def _cuda_in_use():
    import sys

    torch = sys.modules.get("torch")  # never imports torch (or starts CUDA) for a stage that did not
    return torch if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized() else None


def _cuda_peak(cuda) -> int:
    return sum(cuda.cuda.max_memory_allocated(d) for d in range(cuda.cuda.device_count()))


@contextlib.contextmanager
def stage_peak():
    """Measure the peak memory of the work inside; yields a dict filled on exit with ``rss_bytes`` (this process's
    resident peak during the work, what it held before included; None where it cannot be read) and, where CUDA was
    in use, ``cuda_bytes`` (torch's peak allocation summed over the devices)."""
    got: dict = {}
    cuda = _cuda_in_use()
    if _enclosing:  # what the enclosing stage reached so far, before the reset below forgets it
        _fold(_enclosing[-1], {"rss_bytes": _rss_peak(), "cuda_bytes": _cuda_peak(cuda) if cuda else None})
    reset = _reset_rss_peak()
    if cuda is not None:
        for device in range(cuda.cuda.device_count()):
            cuda.cuda.reset_peak_memory_stats(device)
    _enclosing.append({})
    try:
        yield got
    finally:
        inner = _enclosing.pop()
        cuda = cuda or _cuda_in_use()
        _fold(got, {"rss_bytes": _rss_peak() if reset else None, "cuda_bytes": _cuda_peak(cuda) if cuda else None})
        _fold(got, inner)
        got.setdefault("rss_bytes", None)
        if _enclosing:
            _fold(_enclosing[-1], got)


def _fold(into: dict, seen: dict) -> None:
    for key, value in seen.items():
        if value is not None:
            into[key] = max(into.get(key) or 0, value)
