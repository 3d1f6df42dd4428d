"""The CPU engine's heap setting (engine/machine/heap.py): a freed large block serves the next one without new
pages. Runs in a subprocess: the setting is process-wide and stays, and the test worker's own heap is left as is."""
from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.fast

STEPS = 10
# A step's pattern: a 64 MiB tensor and one computed from it, both freed; prints the page faults of STEPS steps.
PROBE = f"""
import resource, sys
import torch
from batchinfer.engine.machine.heap import keep_freed_memory
if sys.argv[1] == "keep":
    assert keep_freed_memory()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range({STEPS}):
    x = torch.ones(16 << 20)
    y = x * 2
    del x, y
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def faults(mode: str) -> int:
    out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, check=True)
    return int(out.stdout.split()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_freed_blocks_are_reused_without_new_pages():
    pages = 2 * STEPS * (64 << 20) // 4096
    default = faults("default")
    assert default >= 0.9 * pages  # glibc's default: each 64 MiB block is a fresh mmap, its pages new
    assert faults("keep") < 0.5 * default  # the first steps grow the heap, the later ones reuse it
