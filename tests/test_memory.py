"""vitviz.memory: a second run of the same allocations touches no fresh pages once freed memory is kept."""

from __future__ import annotations

import json
import platform
import subprocess
import sys

import pytest

# ~120 MB in 2 MB blocks (a Run's graph of ViT-B/16 at 224 px, in the sizes its tensors have), freed, then again:
# the page faults of each round, in a fresh process (the allocator's state is per process).
SCRIPT = """
import json, resource, sys
import numpy as np
if sys.argv[1] == "keep":
    from vitviz.memory import keep_freed_memory
    assert keep_freed_memory()
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
rounds = []
for _ in range(3):
    before = faults()
    blocks = [np.ones(2 * 1024 * 1024 // 8) for _ in range(60)]
    rounds.append(faults() - before)
    del blocks
print(json.dumps(rounds))
"""


def _faults(mode: str) -> list[int]:
    out = subprocess.run([sys.executable, "-c", SCRIPT, mode], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's mallopt is not available here")
def test_a_second_run_reuses_the_freed_memory():
    default, kept = _faults("default"), _faults("keep")
    pages = 60 * 2 * 1024 * 1024 // 4096
    assert default[0] > pages // 2 and kept[0] > pages // 2  # the first round touches its pages either way
    assert min(default[1:]) > pages // 2, default  # glibc's defaults hand the memory back: fresh pages again
    assert max(kept[1:]) < pages // 20, kept  # kept: the second and third rounds reuse it
