"""How this process gets memory for large tensors on a CPU.

glibc serves every allocation above ``M_MMAP_THRESHOLD`` (at most 32 MB, however it adapts) with a fresh ``mmap``
and gives it back with ``munmap`` when freed. A CPU training step allocates and frees dozens of tensors the size of
the logits (B x T x V floats: 16 x 128 x 4,096 is 33.5 MB on the tiny preset), so each one is page-faulted and
zeroed by the kernel again, one 4 KB page at a time: an element-wise op over the logits then costs 2-3x what the
arithmetic does. Raising the thresholds keeps freed blocks in the heap for the next tensor of that size. It changes
where tensors live, never what is computed: results are bit-identical (``tests/unit/test_memory.py``).

PyTorch's tuning guide gets the same effect by preloading jemalloc or tcmalloc; a ``mallopt`` call in the process
does it with nothing to install. Written by hand because no maintained library makes that call. On a system
without glibc it does nothing; ``HARNESS_MALLOC=system`` leaves glibc as it is.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os

log = logging.getLogger(__name__)

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
# Blocks up to 1 GiB come from the heap (a 128,256-token vocabulary's logits for a 512 x 2 batch are 0.5 GB), and up
# to 1 GiB of free heap is kept for reuse instead of being returned.
MMAP_THRESHOLD = 1 << 30
TRIM_THRESHOLD = 1 << 30

_done: bool | None = None


def tune_allocator() -> bool:
    """Raise glibc's mmap and trim thresholds for this process (once); return whether they are raised."""
    global _done
    if _done is not None:
        return _done
    _done = False
    if os.environ.get("HARNESS_MALLOC", "").lower() == "system":
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (macOS, musl without mallopt): nothing to tune
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    # Some glibc versions refuse an mmap threshold above 32 MB (half their largest heap): that one then.
    raised = any(mallopt(M_MMAP_THRESHOLD, value) for value in (MMAP_THRESHOLD, 32 << 20))
    _done = raised and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
    if not _done:
        log.debug("mallopt refused the thresholds; glibc's defaults stay")
    return _done
