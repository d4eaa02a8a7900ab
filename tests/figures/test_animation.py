"""GIF across layers: the maps of each view against the analysis definitions, frames against hand-made overlays."""

import io

import numpy as np
import pytest
from conftest import random_image
from PIL import Image

from vitviz.analysis.rollout import rollout_matrix
from vitviz.capture.forward import capture
from vitviz.figures.animation import BAND, gif_bytes, gif_frames, lens_rows, view_stack
from vitviz.figures.overlay import photo_overlay

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def deit(tiny_models):
    """A DeiT (CLS + DIST, 2 blocks of 4 heads, a 4 x 4 grid) captured with float32 attention."""
    cap = capture(tiny_models["deit"], random_image(0), attention_dtype="float32")
    return cap


def test_views_are_the_attention_and_rollout_of_each_block(deit):
    attn = deit.attentions  # (2, 4, 18, 18): CLS, DIST, 16 patches
    maps, labels = view_stack(deit, "head", head=3)
    assert len(maps) == 2 and labels[1].endswith("head 3")
    for b in range(2):
        np.testing.assert_allclose(maps[b], attn[b, 3, 0, 2:].reshape(4, 4), atol=1e-6)
    maps, labels = view_stack(deit, "mean")
    np.testing.assert_allclose(maps[1], attn[1, :, 0, 2:].mean(0).reshape(4, 4), atol=1e-6)
    assert "mean of 4 heads" in labels[1]
    maps, _ = view_stack(deit, "head", head=0, query=7)  # a patch as the query
    np.testing.assert_allclose(maps[0], attn[0, 0, 7, 2:].reshape(4, 4), atol=1e-6)
    maps, labels = view_stack(deit, "rollout")
    assert labels == ["rollout of block 0", "rollout of blocks 0-1"]
    for b in range(2):
        row = rollout_matrix(attn, num_prefix_tokens=2, stop=b + 1)[0]
        np.testing.assert_allclose(maps[b], (row / row.sum())[2:].reshape(4, 4), atol=1e-6)
    lens = np.arange(3 * 16, dtype=np.float32).reshape(3, 4, 4)
    maps, labels = view_stack(deit, "lens", lens=lens)
    assert len(maps) == 3 and labels[0] == "lens: embeddings" and labels[2] == "lens: after block 1"
    with pytest.raises(ValueError, match="lens is not available"):
        view_stack(deit, "lens")
    with pytest.raises(ValueError, match="no block has a head 9"):
        view_stack(deit, "head", head=9)
    with pytest.raises(ValueError, match="unknown view"):
        view_stack(deit, "tokens")


def test_frames_share_one_scale_and_carry_their_labels():
    photo = random_image(3, (60, 30))  # 60 wide, 30 high
    a, b = np.array([[0.0, 1.0], [2.0, 3.0]]), np.array([[1.0, 5.0], [2.0, 4.0]])
    frames = gif_frames(photo, [a, b], ["block 0", "block 1"], mode="nearest", opacity=0.5)
    assert [f.shape for f in frames] == [(BAND + 30, 60, 3)] * 2
    rgb = np.asarray(photo.convert("RGB"))
    # shared limits: 0..5 over both maps, so a's top cell (3) is not drawn at the top of the scale
    np.testing.assert_array_equal(frames[0][BAND:], photo_overlay(rgb, a, limits=(0, 5), mode="nearest", opacity=0.5))
    np.testing.assert_array_equal(frames[1][BAND:], photo_overlay(rgb, b, limits=(0, 5), mode="nearest", opacity=0.5))
    own = gif_frames(photo, [a, b], ["x", "y"], scale="per_map", mode="nearest", opacity=0.5)
    np.testing.assert_array_equal(own[0][BAND:], photo_overlay(rgb, a, limits=(0, 3), mode="nearest", opacity=0.5))
    # the band: black with white text, different for different labels
    band = frames[0][:BAND]
    assert band.min() == 0 and band.max() > 200 and (band[:, -5:] == 0).all()  # anti-aliased white text
    assert not np.array_equal(frames[0][:BAND], frames[1][:BAND])
    # a large photo is scaled to max_side on its long side
    big = gif_frames(random_image(4, (1200, 600)), [a], ["z"], max_side=300)
    assert big[0].shape == (BAND + 150, 300, 3)
    with pytest.raises(ValueError, match="one label per map"):
        gif_frames(photo, [a, b], ["only one"])


def test_gif_loops_through_every_frame():
    photo = random_image(5, (40, 40))
    maps = [np.eye(4) * (i + 1) + i for i in range(3)]
    frames = gif_frames(photo, maps, ["a", "b", "c"], scale="per_map")
    gif = Image.open(io.BytesIO(gif_bytes(frames, duration_ms=250)))
    assert gif.format == "GIF" and gif.n_frames == 3 and gif.info["loop"] == 0 and gif.info["duration"] == 250
    for i in range(3):
        gif.seek(i)
        decoded = np.asarray(gif.convert("RGB"), dtype=float)
        assert decoded.shape == frames[i].shape
        assert np.abs(decoded - frames[i]).mean() < 6  # 256 colours per frame: close, not exact


def test_a_hierarchical_model_steps_through_its_stages(hier_dirs):
    """Swin: head maps on each stage's own grid, rollout on the first stage's; frames of mixed grids share a scale."""
    from vitviz.analysis.rollout import capture_rollout
    from vitviz.models.load import load_model

    loaded = load_model(str(hier_dirs["swin"]), device="cpu")
    image = random_image(6, (64, 64))
    cap = capture(loaded, image)
    maps, labels = view_stack(cap, "mean")
    assert len(maps) == cap.num_blocks and len({m.shape for m in maps}) > 1  # several stage grids
    roll, _ = view_stack(cap, "rollout")
    first = cap.stages[0]
    for b, m in enumerate(roll):
        row, s = capture_rollout(cap, stop=b + 1)
        assert s == 0 and m.shape == first.grid
        np.testing.assert_allclose(m, row[first.num_prefix :].reshape(first.grid))
    frames = gif_frames(image, maps, labels, scale="shared")
    assert len(frames) == cap.num_blocks and {f.shape for f in frames} == {(BAND + 64, 64, 3)}


def test_lens_rows_name_blocks_as_the_rest_of_the_app(deit, hier_dirs):
    """Row l of the lens is the residual after block l - 1: named with the 0-based label the Block slider shows."""
    from vitviz.figures import lens_figure
    from vitviz.models.load import load_model

    assert lens_rows(deit) == (["embeddings", "after block 0", "after block 1"], ["emb", "0", "1"])
    swin = capture(load_model(str(hier_dirs["swin"]), device="cpu"), random_image(6, (64, 64)))
    rows, ticks = lens_rows(swin)
    assert len(rows) == swin.num_blocks + 1
    assert rows[1] == "after stage 0, block 0" and ticks[1] == "s0.0"
    last = swin.num_blocks - 1
    assert rows[-1] == f"after {swin.block_label(last)}" and ticks[-1].startswith(f"s{len(swin.stages) - 1}.")

    probs = np.array([[0.1], [0.5], [0.9]])
    fig = lens_figure(probs, ["cat"], np.array([3, 2, 1]), target="cat", row_labels=rows[:3], tick_labels=ticks[:3])
    assert list(fig.data[0].customdata) == rows[:3] and list(fig.layout.xaxis.ticktext) == ticks[:3]
    assert "%{customdata}" in fig.data[0].hovertemplate and "%{customdata}" in fig.data[1].hovertemplate
    default = lens_figure(probs, ["cat"], np.array([3, 2, 1]), target="cat")
    assert list(default.data[0].customdata) == ["embeddings", "after block 0", "after block 1"]
    with pytest.raises(ValueError, match="2 row labels for 3 rows"):
        lens_figure(probs, ["cat"], np.array([3, 2, 1]), target="cat", row_labels=rows[:2])
