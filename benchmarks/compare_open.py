"""The first open of *Compare explanations* on the demo model, against one plain forward (issue 22 item 15: <= 3 s).

:func:`compare_first_open`: in a fresh interpreter per run, torch, transformers and the demo model
are loaded first (the app has them before any page opens: *not* counted), one plain forward of
the image is timed (``class_logits`` under ``inference_mode``, median of 5 after a warm-up), then
what the page's first open computes (``ui.common.get_method_maps`` -> ``vitviz.methods.explain_many``
with every method, the image's capture included) is timed from ``import vitviz.methods`` on:
the first call in the process, so every lazy import and first-call cost is in it. Each method's
seconds come from ``explain_many``'s progress callback. A second call on another image gives
the warm cost beside it. Medians over the runs; the ratio is first open over forward, both
taken in the same interpreter.

``page_first_open_s``: the page itself, in Streamlit's ``AppTest`` in another fresh interpreter: the
app's first page is run (it loads the demo model and draws the example image: not counted), then
``switch_page("pages/compare.py").run()`` is timed, widgets, figures and all; its own forward is
timed in that interpreter for ``page_first_open_over_forward``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

__all__ = ["compare_first_open"]

# One plain forward of ``image`` timed (median of 5 after a warm-up), the same in both scripts so their ratios share
# a denominator; it calls the family directly (importing vitviz.methods here would take its import out of the
# first open's clock).
_TIMED_FORWARD = r"""
def forward():
    pixels, _ = preprocess(loaded, [image], hw)
    with torch.inference_mode(), fam.running(loaded.model):
        fam.logits(loaded.model, fam.forward(loaded.model, fam.model_inputs(loaded, pixels, hw)))


forward()
times = []
for _ in range(5):
    t = time.perf_counter()
    forward()
    times.append(time.perf_counter() - t)
"""

_CODE = r"""
import json, statistics, time
import torch, transformers  # noqa: F401
from vitviz.models.load import load_model
from vitviz.data.shapes import make_sample
from vitviz.capture.forward import input_size_for, preprocess

loaded = load_model("demo", device="cpu")
image, other = make_sample(1).image, make_sample(2).image
hw = input_size_for(loaded, None, image.size)
fam = loaded.family

{timed_forward}fwd = statistics.median(times)

per = {}
mark = [0.0, ""]


def progress(done, total, name):
    now = time.perf_counter()
    if mark[1]:
        per[mark[1]] = round(now - mark[0], 3)
    mark[0], mark[1] = now, name


t = time.perf_counter()
from vitviz.methods import explain_many  # noqa: E402

maps = explain_many(loaded, image, progress=progress)
first = time.perf_counter() - t
t = time.perf_counter()
explain_many(loaded, other)
second = time.perf_counter() - t
print(json.dumps({"forward_s": fwd, "first_open_s": first, "second_open_s": second, "methods": per}))
"""


_CODE = _CODE.replace("{timed_forward}", _TIMED_FORWARD)

_PAGE_CODE = r"""
import json, statistics, sys, time
sys.path.insert(0, "tests")
import torch
from app_tools import APP, no_trouble
from streamlit.testing.v1 import AppTest
from vitviz.models.load import load_model
from vitviz.data.shapes import make_sample
from vitviz.capture.forward import input_size_for, preprocess

at = AppTest.from_file(APP, default_timeout=600)
at.run()
no_trouble(at)
loaded = load_model("demo", device="cpu")
image = make_sample(1).image
hw = input_size_for(loaded, None, image.size)

fam = loaded.family
{timed_forward}t = time.perf_counter()
at.switch_page("pages/compare.py").run()
page = time.perf_counter() - t
no_trouble(at, "compare")
print(json.dumps({"forward_s": statistics.median(times), "page_first_open_s": page}))
"""
_PAGE_CODE = _PAGE_CODE.replace("{timed_forward}", _TIMED_FORWARD)


def _one_run(code: str = _CODE) -> dict:
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, capture_output=True, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def compare_first_open(runs: int = 3) -> dict:
    """Medians over ``runs`` fresh interpreters (after one warm-up run for the file cache): ``forward_s``,
    ``first_open_s``, ``second_open_s``, ``first_open_over_forward`` (each run's ratio, median), and each
    method's seconds in the first open."""
    _one_run()
    rs, pages = [], []
    for _ in range(runs):  # interleaved, so that drift of the machine's speed hits both alike
        rs.append(_one_run())
        pages.append(_one_run(_PAGE_CODE))
    methods = {m: round(statistics.median(r["methods"][m] for r in rs), 3) for m in rs[0]["methods"]}
    return {
        "model": "demo",
        "cold_process": "excluded (torch, transformers and the model loaded before the clock starts)",
        "forward_s": round(statistics.median(r["forward_s"] for r in rs), 4),
        "first_open_s": round(statistics.median(r["first_open_s"] for r in rs), 3),
        "second_open_s": round(statistics.median(r["second_open_s"] for r in rs), 3),
        "first_open_over_forward": round(statistics.median(r["first_open_s"] / r["forward_s"] for r in rs), 1),
        "methods_s": methods,
        "page_first_open_s": round(statistics.median(p["page_first_open_s"] for p in pages), 3),
        "page_first_open_over_forward": round(
            statistics.median(p["page_first_open_s"] / p["forward_s"] for p in pages), 1
        ),
        "runs": runs,
    }


def print_row(r: dict) -> None:
    slow = ", ".join(f"{m} {s} s" for m, s in sorted(r["methods_s"].items(), key=lambda kv: -kv[1])[:3])
    print(
        f"Compare explanations, first open on {r['model']} (cold process excluded): {r['first_open_s']} s = "
        f"{r['first_open_over_forward']}x one forward ({r['forward_s']} s); second image {r['second_open_s']} s; "
        f"slowest: {slow}; the page in AppTest {r['page_first_open_s']} s = {r['page_first_open_over_forward']}x"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.compare_open", description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args(argv)
    result = compare_first_open(args.runs)
    print(json.dumps(result, indent=2))
    print_row(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
