"""The Hiera row of the benchmarks (``benchmarks/hiera.py``) runs end to end on a tiny Hiera: the Run's analysis
and the capture's, with the graph kept. Timings are reported, never asserted."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.hiera import make_hiera, overhead  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")


def test_the_hiera_row_runs_on_a_tiny_hiera(tmp_path):
    tiny = dict(image_size=[64, 64], embed_dim=8, depths=[1, 2, 2, 2], num_heads=[1, 2, 2, 4])
    row = overhead(make_hiera(tmp_path / "hiera", **tiny), 1, name="hiera-tiny")
    assert row["model"] == "hiera-tiny" and row["blocks"] == 7 and row["has_graph"]
    assert row["tokens"] == 16 * 16 + 8 * 8 + 4 * 4 + 2 * 2  # every stage's grid, no prefix tokens
    assert row["plain_s"] > 0 and row["vitviz_s"] > 0 and row["capture_s"] > 0 and row["record_MiB"] > 0
