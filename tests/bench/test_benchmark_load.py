"""The load test (``benchmarks/load.py``) as a test: 6 browser sessions for 30 s against the app in public mode.

Each session loads the app, uploads its own image, changes layers and heads and clicks patches
at a human pace, and finally checks its predictions; every head map drawn is compared with the
one vitviz computes for the session's own image. Asserts that nothing went wrong; the latencies
are printed and written to ``test-output/load-test.json`` but not asserted (they depend on the
machine and on what else runs on it). A smaller page than the CLI's default keeps Chromium's
share of a 2-core machine down.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from browser_tools import require_chromium

require_chromium()

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.load import print_table, run_load  # noqa: E402

OUTPUT = ROOT / "test-output"


def test_six_sessions_for_thirty_seconds_in_public_mode(capsys):
    started = time.monotonic()
    # min_changes: on a busy machine the six page loads alone (~7 CPU s of Chromium each) can fill the 30 s
    r = run_load(
        6,
        30,
        ramp=6,
        think=(1.0, 2.5),
        min_changes=1,
        viewport=(1100, 800),
        quiet=True,
        log=OUTPUT / "load-test-streamlit.log",
    )
    took = time.monotonic() - started
    OUTPUT.mkdir(exist_ok=True)
    (OUTPUT / "load-test.json").write_text(json.dumps(r, indent=1, default=str))
    with capsys.disabled():
        print_table(r)

    assert r["all_loaded"], [p["session"] for p in r["per_session"] if not p["loaded"]]
    assert not r["errors"], r["errors"]
    assert r["all_correct"], [
        (p["session"], p["checks"], p["maps_not_own"]) for p in r["per_session"] if not p["correct"]
    ]
    assert all(p["finished"] for p in r["per_session"]), [p["session"] for p in r["per_session"] if not p["finished"]]
    assert all(p["upload_to_map_s"] for p in r["per_session"])  # every session drew its own image's first map
    assert r["latency_s"]["change_to_redraw"]["n"] >= 6, r["latency_s"]  # the sessions did act on Heads
    assert took < 170, f"the load test took {took:.0f} s"


# The patching session's server: the work bound shrunk to ~6 forward-equivalents at the widest input (2,041 tokens
# for the demo model at 680 x 192 px), so the exact grids stop at the cap within seconds; the memory settings small,
# so the memory bound derived from them is a tight one.
PATCHING_ENV = {
    "VITVIZ_PATCHING_MAX_WORK": "12000",
    "VITVIZ_MEMORY_BUDGET_MB": "512",
    "VITVIZ_RUN_CACHE_MB": "512",
    "VITVIZ_CAPTURE_CACHE_MB": "256",
}
# The others' change -> redraw p95 while the patching session is busy (its wide upload, estimate and exact grids) over
# their p95 otherwise, in the same run: patching runs batch by batch in the forward queue and a change on Heads needs
# no forward pass, so what the others feel is the CPU the patching batches take (2 cores, shared with Chromium).
OTHERS_P95_FACTOR = 4.0


def test_a_patching_session_at_the_widest_input_while_others_browse(capsys):
    started = time.monotonic()
    # 2 sessions browse Heads: 3 changes each before the patching session's busy window, changes during it, and 3
    # more after it (past the 10 s deadline if need be)
    r = run_load(
        2,
        10,
        ramp=2,
        think=(1.5, 3.0),
        min_changes=3,
        viewport=(1100, 800),
        quiet=True,
        log=OUTPUT / "load-test-patching-streamlit.log",
        patching=True,
        patching_after=3,
        server_env=PATCHING_ENV,
    )
    took = time.monotonic() - started
    OUTPUT.mkdir(exist_ok=True)
    (OUTPUT / "load-test-patching.json").write_text(json.dumps(r, indent=1, default=str))
    with capsys.disabled():
        print_table(r)

    assert not r["errors"], r["errors"]
    assert r["all_loaded"] and r["all_correct"], r["per_session"]
    pt = r["patching"]
    assert pt["finished"], pt
    # the widest input the limits accept: 2,041 tokens at 680 x 192 px, a patch wider would be 2,065 > 2,048
    assert pt["input_px"] == {"height": 192, "width": 680}, pt["input_px"]
    assert pt["cells_total"] == pt["cells_expected"] == 4 * 2041 + 4 * 4, pt  # the grids of that input
    assert pt["capped"] and "12,000 forward-equivalents x tokens" in pt["note"], pt["note"]
    assert 0 < pt["cells_done"] < pt["cells_total"]
    others = pt["others_change_to_redraw"]
    assert others["during_patching"]["n"] >= 2 and others["without_patching"]["n"] >= 2, others
    assert others["p95_ratio"] <= OTHERS_P95_FACTOR, others
    mem = r["server_memory_MiB"]
    assert mem["peak_sampled"] <= mem["bound"], mem
    # 140-170 s on 2 cores with other programs taking half of them (2026-11-27): the estimate and the capped exact
    # grids at 2,041 tokens got 40 s each of the server's ~20 % share
    assert took < 300, f"the load test took {took:.0f} s"
