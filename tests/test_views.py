"""Views are functions of their state: a pane's model and capture come from a ``PaneState``, not the session."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import numpy as np
import pytest
from app_tools import no_trouble
from PIL import Image
from streamlit.testing.v1 import AppTest

from vitviz.analysis.blocks import head_maps
from vitviz.analysis.rollout import capture_rollout
from vitviz.capture.gradients import explain_classes
from vitviz.capture.run import capture
from vitviz.compare import token_of
from vitviz.models.load import load_model

ROOT = str(Path(__file__).resolve().parents[1])
EXAMPLES = Path(ROOT) / "assets" / "examples"

pytestmark = pytest.mark.usefixtures("one_thread")


def _current_of_script(root: str, state) -> None:
    """``current_of(state)`` first with nothing in the session (a read would raise), then with the sidebar's state."""
    import sys

    if root not in sys.path:
        sys.path.insert(0, root)
    import streamlit as st

    from pages import common

    def seen(cur):
        labels = None if cur.labels is None else cur.labels.names
        return cur.key, cur.cap.model_name, labels, common.classes(cur).ranked[0].label

    empty = common.current_of(state)
    common.init_state()  # the session: demo on demo-star.png
    st.session_state.update(labels_text="cat, dog", template="a photo of a {}.")
    again = common.current_of(state)
    st.session_state.seen = seen(empty), seen(again), seen(common.current())


def test_current_of_reads_no_session_state():
    from pages.common import PaneState, digest

    data = (EXAMPLES / "demo-circle.png").read_bytes()
    state = PaneState("demo-clip", data, digest(data), (64, 64), "circle, star, square", "a {} on a background.")
    at = AppTest.from_function(_current_of_script, args=(ROOT, state), default_timeout=180)
    at.run()
    no_trouble(at)
    empty, again, session = at.session_state.seen
    assert empty == again  # the session's model, image and labels changed nothing
    key, model, labels, top = empty
    assert key == ("demo-clip", digest(data), (64, 64)) and model == "demo-clip"
    assert labels == ("circle", "star", "square") and top in labels
    assert session[1] == "demo" and session[2] is None  # current() is the sidebar's pane
    assert session[0][1] == digest((EXAMPLES / "demo-star.png").read_bytes())


def _twice_script(root: str, states: tuple, block: int, head: int, point: tuple[float, float]) -> None:
    """One script draws the head map, the mean of heads, the rollout and relevance twice: once per pane state."""
    import sys

    if root not in sys.path:
        sys.path.insert(0, root)
    from pages import common, views
    from vitviz.compare import token_of

    for who, state in zip("AB", states, strict=True):
        cur = common.current_of(state)
        query = token_of(cur.cap, cur.cap.blocks[block].stage, point)
        one = views.HeadSettings(block, query, head=head)
        views.draw_head_map(cur, one, key=f"{who}_head", title_prefix=f"{who}. ")
        views.draw_head_map(
            cur, views.HeadSettings(block, query, head=None), key=f"{who}_mean", title_prefix=f"{who}. "
        )
        views.draw_rollout(cur, views.RolloutSettings(), key=f"{who}_rollout", title_prefix=f"{who}. ")
        top = common.classes(cur).ranked[0]
        explained = views.RelevanceSettings(top.index, top.label, start_block=1)
        views.draw_relevance(cur, explained, key=f"{who}_relevance", title_prefix=f"{who}. ")


def _charts(at: AppTest) -> dict[str, np.ndarray]:
    """Each chart's heatmap by its title."""
    out = {}
    for el in at.get("plotly_chart"):
        spec = json.loads(el.proto.spec)
        z = next(t["z"] for t in spec["data"] if t["type"] == "heatmap")
        if isinstance(z, dict):  # plotly's typed array
            arr = np.frombuffer(base64.b64decode(z["bdata"]), dtype=z["dtype"])
            z = arr.reshape([int(n) for n in str(z.get("shape", arr.size)).split(",")])
        out[spec["layout"]["title"]["text"]] = np.asarray(z, dtype=np.float64)
    return out


def test_one_view_drawn_twice_with_two_states_shows_each_states_own_numbers():
    from pages.common import PaneState, digest

    names = ("demo-star.png", "demo-circle.png")
    states = []
    for name in names:
        data = (EXAMPLES / name).read_bytes()
        states.append(PaneState("demo", data, digest(data)))
    block, head, point = 2, 1, (0.7, 0.4)
    at = AppTest.from_function(_twice_script, args=(ROOT, tuple(states), block, head, point), default_timeout=180)
    at.run()
    no_trouble(at)
    charts = _charts(at)
    assert len(charts) == 8  # eight titles: no chart replaced another

    loaded = load_model("demo", device="cpu")
    refs = {}
    for who, name in zip("AB", names, strict=True):
        image = Image.open(EXAMPLES / name).convert("RGB")
        cap = capture(loaded, image)  # each image on its own, outside the app
        query = token_of(cap, 0, point)
        maps = head_maps(cap.blocks[block], query).values
        row, _ = capture_rollout(cap)
        top = int(np.argmax(cap.logits))
        exp = explain_classes(loaded, image, [top], start_block=1)[top]
        refs[who] = {
            f"{who}. layer {block}, head {head}: where {cap.token_label(query)} looks": maps[head],
            f"{who}. layer {block}, mean of {cap.blocks[block].num_heads} heads: where {cap.token_label(query)} looks": (
                maps.astype(np.float64).mean(axis=0)
            ),
            f"{who}. rollout of what the model reads, layers 0-{cap.num_blocks - 1}": (
                row[cap.num_prefix_tokens :].reshape(cap.grid)
            ),
            f"{who}. relevance for '{loaded.id2label[top]}' (Chefer et al. 2021)": exp.patch_map(),
        }
        for title, ref in refs[who].items():
            assert title in charts, (title, list(charts))
            assert np.allclose(charts[title], ref, rtol=1e-3, atol=1e-6), title
    for a, b in zip(refs["A"].values(), refs["B"].values(), strict=True):
        assert not np.allclose(a, b, rtol=1e-3, atol=1e-6)  # the two states' maps differ: neither reused the other
