"""glibc malloc tuned for training on the CPU: freed activation buffers are kept for reuse.

PyTorch's CPU tensors come from the C allocator. glibc sizes two thresholds dynamically: blocks
above the mmap threshold are mapped and unmapped on every free, and free memory above the trim
threshold at the top of the heap goes back to the OS. A training step allocates tens of MB of
activations and frees them all at its end, so under the dynamic thresholds every step maps fresh
pages and page-faults on each first touch: about 850 minor faults per attack pass of the grouped
quickstart (10 clients, batch 32; 1.2 ms of system time and 25 % of the pass on this 2-core VM).
Fixing the thresholds (`mallopt`, as the glibc manual describes: M_MMAP_THRESHOLD 32 MiB, glibc's
own ceiling for the dynamic value, and M_TRIM_THRESHOLD 1 GiB) keeps those pages in the heap:
no faults after the first step. Blocks over 32 MiB would still be mapped afresh on every
allocation, so mapping is switched off (M_MMAP_MAX 0) and they come from the heap too: a grouped
ResNet10 round of 10 clients (issue 50) allocates and frees 94 MB weight gradients, momentum
buffers and weight-decay temporaries for its last stage, 70,000-170,000 page faults a round and
a tenth of its time before (bench/throughput.py). The heap top goes back to the OS once more
than 1 GiB of it is free (each Ray worker keeps up to that much).

The setting is process-wide and changes no value, only where memory comes from; real training
(`edgefl.experiment.prepare.method_context`) makes it, in the main process and in Ray workers.
It is a no-op where the C library is not glibc.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD, M_MMAP_MAX = -1, -3, -4  # glibc's malloc.h
MMAP_BYTES, TRIM_BYTES = 32 << 20, 1 << 30  # mallopt takes a C int: TRIM_BYTES < 2**31


@functools.cache
def keep_freed_memory() -> bool:
    """Fix glibc's mmap and trim thresholds and switch mapping off (see the module docstring); True
    when glibc took them."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    settings = [(M_MMAP_THRESHOLD, MMAP_BYTES), (M_TRIM_THRESHOLD, TRIM_BYTES), (M_MMAP_MAX, 0)]
    return all([mallopt(key, value) for key, value in settings])
