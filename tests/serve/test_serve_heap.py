"""``smetric serve`` keeps the memory one request frees for the next (:func:`smetric.serve.cli.keep_freed_heap`).

Each check runs in a fresh interpreter (the setting is process-wide): a loop that allocates and
frees a request's worth of large buffers (four of 300 KB, as a 32K-token-id body and its parse
are), counting the minor page faults of each round. Without the setting glibc hands the freed
heap back and every round faults its pages in again (the control); with it, none.
"""

from __future__ import annotations

import ctypes
import subprocess
import sys

import pytest

CHURN = """
import resource, sys
if {keep}:
    from smetric.serve.cli import keep_freed_heap
    assert keep_freed_heap()

def request():
    buffers = [bytearray(300_000) for _ in range(4)]
    for b in buffers:
        b[::4096] = b"x" * len(b[::4096])  # touch every page

for _ in range(5):
    request()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(50):
    request()
print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 50)
"""


def faults_per_round(keep: bool) -> float:
    out = subprocess.run(
        [sys.executable, "-c", CHURN.format(keep=keep)], capture_output=True, text=True, timeout=60, check=True
    )
    return float(out.stdout)


@pytest.mark.skipif(not hasattr(ctypes.CDLL(None), "gnu_get_libc_version"), reason="glibc's malloc only")
def test_freed_request_buffers_are_reused_without_page_faults() -> None:
    assert faults_per_round(keep=False) > 100, "the control: glibc's defaults hand the freed heap back"
    assert faults_per_round(keep=True) < 5
