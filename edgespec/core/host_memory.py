"""Host memory given back: buffers of megabytes (saved KV states) mapped and unmapped
by the allocator, not carved out of its heap.

glibc's malloc serves a request above its mmap threshold (128 KiB at first) with a
mapping of its own, which ``free`` hands back to the system. But each time it frees
such a block it raises the threshold to that block's size (up to 32 MiB), so that the
next ones, saved states of 10-30 MB included, come from the heap, where the holes they
leave stay resident. A server that saves and drops states for weeks then grows by its
fragmentation: a soak of 300 requests (docs/benchmarks.md, "A server left on") grew
about 25 MiB per 100 requests with the threshold moving, and 15 with it fixed.
Fixing the threshold (``mallopt(M_MMAP_THRESHOLD, ...)``) turns the adjustment off;
and after evictions :func:`give_back` returns the heap's free pages (``malloc_trim``),
where smaller buffers leave holes too.
"""

from __future__ import annotations

import ctypes
import os
import sys

M_MMAP_THRESHOLD = -3  # glibc's malloc.h
THRESHOLD = 4 * 2**20  # bytes: a state is larger; a round's rows of logits mostly are not


def map_large_buffers(threshold: int = THRESHOLD) -> bool:
    """Have glibc's malloc map every block of ``threshold`` bytes or more (unless the
    user set ``MALLOC_MMAP_THRESHOLD_``); False where that cannot be done (not Linux,
    or a libc without ``mallopt``, such as musl)."""
    if not sys.platform.startswith("linux") or "MALLOC_MMAP_THRESHOLD_" in os.environ:
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(M_MMAP_THRESHOLD, threshold))


def give_back() -> None:
    """Return the allocator heap's free pages to the system (glibc's ``malloc_trim``;
    elsewhere nothing)."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None).malloc_trim(0)
        except (OSError, AttributeError):
            pass
