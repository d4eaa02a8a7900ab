"""Views are functions of their state: a pane's model and capture come from a ``PaneState``, not the session."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import numpy as np
import pytest
from app_tools import charts, no_trouble
from PIL import Image
from streamlit.testing.v1 import AppTest

from vitviz.analysis.blocks import global_query, head_maps, row_map, select
from vitviz.analysis.masks import mass_masks
from vitviz.analysis.rollout import capture_rollout
from vitviz.analysis.stats import summary_table
from vitviz.capture.forward import capture
from vitviz.capture.gradients import explain_classes
from vitviz.causal import capture_knocked_out, logit_lens
from vitviz.compare import depth_match, token_of
from vitviz.models.load import load_model

ROOT = str(Path(__file__).resolve().parents[2])
EXAMPLES = Path(ROOT) / "assets" / "examples"

pytestmark = pytest.mark.usefixtures("one_thread")


def _current_of_script(root: str, state) -> None:
    """``current_of(state)`` first with nothing in the session (a read would raise), then with the sidebar's state."""
    import sys

    if root not in sys.path:
        sys.path.insert(0, root)
    import streamlit as st

    from ui import common

    def seen(cur):
        labels = None if cur.labels is None else cur.labels.names
        return cur.key, cur.cap.model_name, labels, common.classes(cur).ranked[0].label

    empty = common.current_of(state)
    common.init_state()  # the session: demo on demo-star.png
    st.session_state.update(labels_text="cat, dog", template="a photo of a {}.")
    again = common.current_of(state)
    st.session_state.seen = seen(empty), seen(again), seen(common.current())


def test_current_of_reads_no_session_state():
    from ui.common import PaneState, digest

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
    """One script draws every view of ui/attention_views.py twice: once per pane state.

    Nothing is put in the session first, so a view that read the sidebar's state there would raise.
    """
    import sys

    if root not in sys.path:
        sys.path.insert(0, root)
    from ui import attention_views, common
    from vitviz.capture.targets import Target
    from vitviz.compare import token_of

    for who, state in zip("AB", states, strict=True):
        cur = common.current_of(state)
        query = token_of(cur.cap, cur.cap.blocks[block].stage, point)
        one = attention_views.HeadSettings(block, query, head=head)
        attention_views.draw_blocks(cur, attention_views.BlocksSettings(0, query, "max"), key=f"{who}_blocks")
        attention_views.draw_head_grid(cur, one, key=f"{who}_head")
        attention_views.draw_masks(cur, attention_views.MasksSettings(tau=0.5), key=f"{who}_masks")
        attention_views.draw_summaries(
            cur, attention_views.SummarySettings("entropy", marked=(block, head)), key=f"{who}_summaries"
        )
        attention_views.draw_head_map(cur, one, key=f"{who}_head", title_prefix=f"{who}. ")
        attention_views.draw_head_side(cur, one, key=f"{who}_head")
        knocked = attention_views.KnockoutSettings(((1, 0), (1, 2)), "zero", after=one)
        attention_views.draw_knockout(cur, knocked, key=f"{who}_knockout")
        mean = attention_views.HeadSettings(block, query, head=None)
        attention_views.draw_head_map(cur, mean, key=f"{who}_mean", title_prefix=f"{who}. ")
        attention_views.draw_rollout(
            cur, attention_views.RolloutSettings(), key=f"{who}_rollout", title_prefix=f"{who}. "
        )
        attention_views.draw_lens(cur, attention_views.LensSettings(top=3), key=f"{who}_lens")
        top = common.classes(cur).ranked[0]
        explained = attention_views.RelevanceSettings(Target.of_class(top.index), start_block=1)
        attention_views.draw_relevance(cur, explained, key=f"{who}_relevance", title_prefix=f"{who}. ")


def _array(z) -> np.ndarray:
    """A plotly array from a figure's JSON (a list, or the typed form ``{"dtype", "bdata", "shape"}``)."""
    if isinstance(z, dict):
        arr = np.frombuffer(base64.b64decode(z["bdata"]), dtype=z["dtype"])
        z = arr.reshape([int(n) for n in str(z.get("shape", arr.size)).split(",")])
    return np.asarray(z, dtype=np.float64)


def _charts(at: AppTest) -> dict[str, tuple[str, np.ndarray, list]]:
    """Each chart's title, heatmap (empty for a chart of lines) and traces, by its key."""
    out = {}
    for el in charts(at):
        spec = json.loads(el.proto.spec)
        z = next((t["z"] for t in spec["data"] if t["type"] == "heatmap"), [])
        title = spec["layout"].get("title", {}).get("text", "")
        out[el.proto.id.split("-", 2)[2]] = (title, _array(z), spec["data"])
    return out


def _tiles(z: np.ndarray, k: int, grid: tuple[int, int], cols: int = 6) -> np.ndarray:
    """The k tiles of a small-multiples heatmap: ``tile_gap`` rows and one column between tiles, ``min(cols, k)``
    tiles a row."""
    from vitviz.figures import tile_gap

    (gh, gw), cols = grid, min(cols, k)
    stride = gh + tile_gap(gh)
    places = [divmod(i, cols) for i in range(k)]
    return np.stack([z[r * stride : r * stride + gh, c * (gw + 1) : c * (gw + 1) + gw] for r, c in places])


def test_one_view_drawn_twice_with_two_states_shows_each_states_own_numbers():
    from ui.common import PaneState, digest

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
    assert len(charts) == 26  # 26 keys: no chart replaced another

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
        where = f"where {cap.token_label(query)} looks"
        refs[who] = {
            f"{who}_head_map": (f"{who}. block {block}, head {head}: {where}", maps[head]),
            f"{who}_mean_map": (
                f"{who}. block {block}, mean of {len(maps)} heads: {where}",
                maps.astype(np.float64).mean(axis=0),
            ),
            f"{who}_rollout_map": (
                f"{who}. rollout of what the model reads, blocks 0-{cap.num_blocks - 1}",
                row[cap.num_prefix_tokens :].reshape(cap.grid),
            ),
            f"{who}_relevance_map": (
                f"{who}. relevance for {loaded.id2label[top]} ({top}) (Chefer et al. 2021)",
                exp.patch_map(),
            ),
        }
        for key, (title, ref) in refs[who].items():
            assert charts[key][0] == title
            assert np.allclose(charts[key][1], ref, rtol=1e-3, atol=1e-6), key
        tiles = _tiles(charts[f"{who}_head_grid"][1], len(maps), cap.grid)
        assert np.allclose(tiles, maps, rtol=1e-3, atol=1e-6)
        refs[who]["grid"] = ("", maps)
        fused = [row_map(b.geometry, select(b, fusion="max"), query).values for b in cap.blocks]
        blocks = _tiles(charts[f"{who}_blocks_0"][1], cap.num_blocks, cap.grid)
        assert np.allclose(blocks, np.stack(fused), rtol=1e-3, atol=1e-6)
        refs[who]["blocks"] = ("", blocks)
        last = cap.blocks[-1]
        masks = mass_masks(head_maps(last, global_query(last)).values, tau=0.5)
        assert np.array_equal(_tiles(charts[f"{who}_masks_grid"][1], last.num_heads, cap.grid), masks)
        entropy = summary_table(cap.blocks, "entropy")
        assert np.allclose(charts[f"{who}_summaries_map"][1], entropy, rtol=1e-5, equal_nan=True)
        refs[who]["summaries"] = ("", entropy)
        row_q = select(cap.blocks[block], head=head)[query].astype(np.float64)  # (T,) the query's whole row
        bars = _array(charts[f"{who}_head_prefix"][2][0]["y"])  # CLS, then all patches together
        assert np.allclose(bars, [row_q[0], row_q[1:].sum()], atol=1e-3) and bars.sum() == pytest.approx(1, abs=2e-3)
        refs[who]["prefix"] = ("", bars)
        knocked_cap, _ = capture_knocked_out(loaded, image, [(1, 0), (1, 2)], mode="zero")
        after = head_maps(knocked_cap.blocks[block], query).values
        assert np.allclose(_tiles(charts[f"{who}_knockout_heads"][1], len(after), cap.grid), after, atol=1e-6)
        assert not np.allclose(after, maps, atol=1e-3)  # the knock-out changed block 2's attention
        refs[who]["knockout"] = ("", after)
        lens = logit_lens(loaded, image)
        top3 = np.argsort(-lens.logits[-1])[:3]
        drawn = np.stack([_array(t["y"]) for t in charts[f"{who}_lens_chart"][2][:3]], axis=1)
        assert np.allclose(drawn, lens.probabilities()[:, top3], rtol=1e-4, atol=1e-7)
        refs[who]["lens"] = ("", drawn)
    for (_, a), (_, b) in zip(refs["A"].values(), refs["B"].values(), strict=True):
        assert not np.allclose(a, b, rtol=1e-3, atol=1e-6)  # the two states' maps differ: neither reused the other


def test_side_by_side_panes_are_each_models_own_head_map():
    """The Side by side page calls the Heads page's view once per pane: each pane shows its model's own map."""
    from app_tools import APP

    at = AppTest.from_file(APP, default_timeout=180)
    at.run()
    at.switch_page("pages/side_by_side.py").run()
    at.selectbox(key="sbs_model").set_value("demo-swin").run()
    at.number_input(key="sbs_head").set_value(1).run()
    point = (0.3, 0.6)
    at.session_state["sbs_point"] = point  # what a click on either map stores
    at.run()
    no_trouble(at)
    charts = _charts(at)
    image = Image.open(EXAMPLES / "demo-star.png").convert("RGB")  # the sidebar's image
    caps = [capture(load_model(name, device="cpu"), image) for name in ("demo", "demo-swin")]
    block_a = at.slider(key="sbs_block").value
    blocks = (block_a, depth_match(block_a, caps[0].num_blocks, caps[1].num_blocks))
    assert blocks[0] == caps[0].num_blocks - 1  # the default: the last block
    for key, cap, block in zip(("sbs_a_map", "sbs_b_map"), caps, blocks, strict=True):
        want = head_maps(cap.blocks[block], token_of(cap, cap.blocks[block].stage, point)).values[1]
        title, got, _ = charts[key]
        assert title.startswith(f"{key[4].upper()}. {cap.model_name}: ") and "head 1" in title
        assert np.allclose(got, want, rtol=1e-3, atol=1e-6), key


def test_a_click_on_a_side_by_side_pane_moves_both_queries_in_the_same_run():
    """A click is read before the panes are computed: the run it starts draws both maps at the clicked point."""
    from app_tools import APP

    at = AppTest.from_file(APP, default_timeout=180)
    at.run()
    at.switch_page("pages/side_by_side.py").run()
    at.radio(key="sbs_differs").set_value("images").run()
    no_trouble(at)
    h, w = capture(load_model("demo", device="cpu"), Image.open(EXAMPLES / "demo-star.png")).input_size
    # what Plotly sends for a click at 30 % of the width and 60 % of the height: [token, row, col, value, x, y]
    at.session_state["sbs_a_map"] = {"selection": {"points": [{"customdata": [0, 0, 0, 0.0, 0.3 * w, 0.6 * h]}]}}
    at.run()
    no_trouble(at)
    charts = _charts(at)
    for key in ("sbs_a_map", "sbs_b_map"):
        assert "where patch (7, 3) looks" in charts[key][0].replace("<br>", " "), charts[key][
            0
        ]  # a title may wrap  # 12 x 12: row int(0.6 * 12), col 3
