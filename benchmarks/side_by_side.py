"""Benchmark of the Side by side page (two models on one image) against one pane: server-side reruns (AppTest).

    python -m benchmarks.side_by_side [--runs 7]

Issue 21's rows: "both panes drawn <= 2x one pane's time; a synced click <= 1.5x one pane's rerun". One pane is
the Heads page of the same image (the app's one-pane view), with pane A's model and with pane B's; the Side by side
page shows `demo` (pane A) and `demo-swin` (pane B) with the view "one head". Timed, interleaved per round, medians:

* ``*_rerun_ms``: a rerun with nothing changed (every capture cached: what each widget change costs at least);
* ``*_click_ms``: a rerun after a click, set as the click sets it (Heads: ``query``; Side by side: ``sbs_point``,
  which both panes read);
* ``*_first_ms``: the page drawn for a new image (both panes' forwards included): the image is replaced in the
  session as an upload replaces it.
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

__all__ = ["side_by_side"]


def _steady_pages() -> None:
    """A running server leaves Streamlit's legacy pages-folder mode once, at its first run; AppTest re-enters it on
    every run, which would time the page twice (as ``benchmarks.run.interaction``)."""
    from streamlit.runtime.pages_manager import PagesManager

    original = PagesManager.__init__
    if getattr(original, "_vitviz_steady", False):
        return

    def steady_state(self, *args, **kwargs):
        original(self, *args, **kwargs)
        PagesManager.uses_pages_directory = False

    steady_state._vitviz_steady = True
    PagesManager.__init__ = steady_state


def _png(seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (120, 160, 3), dtype=np.uint8)).save(buf, format="PNG")
    return buf.getvalue()


def _titles(at) -> list[str]:
    """The title of every Plotly figure on the page, in order: ``st.plotly_chart``'s and the clickable maps'
    (``ui/click_chart.py``, a custom component whose data holds the figure's JSON as ``spec``)."""
    specs = [
        el.proto.spec if el.type == "plotly_chart" else json.loads(el.proto.json)[0]["spec"]
        for el in at._tree
        if el.type == "plotly_chart"
        or (el.type == "bidi_component" and el.proto.component_name == "vitviz_click_chart")
    ]
    return [json.loads(spec)["layout"]["title"]["text"] for spec in specs]


def _ms(fn) -> float:
    t = time.perf_counter()
    fn()
    return 1000 * (time.perf_counter() - t)


def side_by_side(runs: int = 7, model_a: str = "demo", model_b: str = "demo-swin") -> dict:
    """Medians (ms) and ratios of the Side by side page against the Heads page (module docstring)."""
    from streamlit.testing.v1 import AppTest

    _steady_pages()

    def app(model: str, page: str) -> AppTest:
        at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=300)
        at.session_state["model_name"] = model
        at.session_state["instant_heads"] = False  # the server-drawn Heads view (a change reruns the page)
        at.run()
        at.switch_page(page).run()
        assert not at.exception, at.exception
        return at

    heads = {m: app(m, "pages/heads.py") for m in (model_a, model_b)}
    sbs = app(model_a, "pages/side_by_side.py")
    sbs.selectbox(key="sbs_model").set_value(model_b).run()
    sbs.radio(key="sbs_view").set_value("head").run()
    assert not sbs.exception, sbs.exception
    titles = _titles(sbs)
    assert len(titles) >= 2 and titles[1].startswith(f"B. {model_b}"), titles

    def ok(at: AppTest) -> None:
        assert not at.exception, at.exception
        assert not at.error, [e.value for e in at.error]

    def click_heads(at: AppTest, i: int) -> None:
        at.session_state["query"] = 1 + (i * 37) % 100
        at.run()
        ok(at)

    def click_sbs(i: int) -> None:
        sbs.session_state["sbs_point"] = (((i * 37) % 97) / 97, ((i * 53) % 89) / 89)  # what a click stores
        sbs.run()
        ok(sbs)

    def new_image(at: AppTest, seed: int) -> None:
        import hashlib

        data = _png(seed)
        at.session_state["image_bytes"] = data  # what ui.common.set_image stores for an upload
        at.session_state["image_name"] = f"bench{seed}.png"
        at.session_state["image_digest"] = hashlib.sha256(data).hexdigest()
        at.session_state["image_wh"] = (160, 120)
        at.session_state["query"] = None
        at.run()
        ok(at)

    t: dict[str, list[float]] = {}

    def add(name: str, ms: float) -> None:
        t.setdefault(name, []).append(ms)

    for at in (*heads.values(), sbs):  # warm-up
        at.run(), at.run()
    for i in range(runs):
        for m, at in heads.items():
            add(f"heads_{m}_rerun_ms", _ms(lambda at=at: (at.run(), ok(at))))
            add(f"heads_{m}_click_ms", _ms(lambda at=at, i=i: click_heads(at, i)))
        add("sbs_rerun_ms", _ms(lambda: (sbs.run(), ok(sbs))))
        add("sbs_click_ms", _ms(lambda i=i: click_sbs(i)))
    firsts = max(2, runs // 2)
    for i in range(firsts):
        for m, at in heads.items():
            add(f"heads_{m}_first_ms", _ms(lambda at=at, i=i: new_image(at, 1000 + i)))
        add("sbs_first_ms", _ms(lambda i=i: new_image(sbs, 2000 + i)))
    click_sbs(runs)  # the last state drawn: a click's query in both panes (what the test reads)
    last_titles = _titles(sbs)
    med = {k: round(statistics.median(v), 1) for k, v in t.items()}
    a, b = (f"heads_{m}" for m in (model_a, model_b))
    out: dict = {"models": [model_a, model_b], "runs": runs, **med}
    for what in ("rerun", "click", "first"):
        one = (med[f"{a}_{what}_ms"] + med[f"{b}_{what}_ms"]) / 2
        out[f"sbs_{what}_over_one_pane"] = round(med[f"sbs_{what}_ms"] / one, 2)  # one pane: the two Heads pages' mean
        out[f"sbs_{what}_over_heads_{model_a}"] = round(med[f"sbs_{what}_ms"] / med[f"{a}_{what}_ms"], 2)
    out["sbs_click_over_one_pane_rerun"] = round(
        med["sbs_click_ms"] / ((med[f"{a}_rerun_ms"] + med[f"{b}_rerun_ms"]) / 2), 2
    )
    out["last_titles"] = last_titles[:2]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args(argv)
    print(json.dumps({"side_by_side": side_by_side(args.runs)}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
