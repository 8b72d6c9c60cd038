"""glibc malloc keeps freed buffers after `keep_freed_memory` (edgefl.training.allocator): a
step's worth of large blocks allocated, touched and freed again page-faults only the first time,
blocks over glibc's 32 MiB mmap ceiling too (a grouped ResNet10's last-stage gradients, issue 50)."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

CHURN = """
import resource, sys
if sys.argv[1] == "keep":
    from edgefl.training.allocator import keep_freed_memory
    assert keep_freed_memory()
def step():  # 40 MB of blocks (4 MB: over glibc's dynamic thresholds), every page touched, all freed
    blocks = [bytearray(int(sys.argv[2]) << 20) for _ in range(40 // int(sys.argv[2]))]
    for b in blocks:
        b[::4096] = bytes(len(b[::4096]))
step()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(5):
    step()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def faults(mode: str, mb: int) -> int:
    out = subprocess.run([sys.executable, "-c", CHURN, mode, str(mb)], capture_output=True, text=True,
                         check=True)
    return int(out.stdout)


@pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc only")
@pytest.mark.parametrize("mb", [4, 40])  # under and over glibc's mmap ceiling of 32 MiB
def test_freed_blocks_are_reused_without_page_faults(mb: int) -> None:
    pages = 5 * 40 * (1 << 20) // 4096  # every page of the five later steps
    if faults("default", mb) < pages // 2:  # glibc's dynamic thresholds hand the pages back each step
        pytest.skip("this host's heap keeps its pages anyway (huge pages, MALLOC_* settings or a preload)")
    assert faults("keep", mb) < pages // 100
