"""Views are functions of their state: a pane's model and capture come from a ``PaneState``, not the session."""

from __future__ import annotations

from pathlib import Path

import pytest
from app_tools import no_trouble
from streamlit.testing.v1 import AppTest

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
