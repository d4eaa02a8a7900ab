"""The deformable-attention view (vitviz.figures.deformable) on a tiny random DAT.

Its points and weights are checked against the model's own outputs: the positions the
forward returns (``output_sampling=True``), placed in pixels by the ``align_corners=True``
rule written out here, and the record's spread map, rebuilt from the view's weights by
explicit bilinear spreading. The figure is checked for what it draws.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from conftest import random_image
from transformers import ViTImageProcessor

from vitviz.capture.deformable import deformable_samples, query_points
from vitviz.capture.forward import capture, input_size_for, preprocess
from vitviz.figures.deformable import deformable_figure
from vitviz.models.load import load_model
from vitviz.record import POOLED
from vitviz.zoo.dat import DatConfig, DatForImageClassification

pytestmark = pytest.mark.usefixtures("one_thread")

TINY = dict(
    image_size=32,
    patch_size=2,
    dim_stem=8,
    dims=[8, 16, 32, 64],
    depths=[2, 2, 2, 2],
    heads=[1, 2, 4, 4],
    window_sizes=[4, 4, 2, 2],
    groups=[-1, -1, 2, 2],
    stage_spec=[["L", "S"], ["L", "S"], ["D", "L"], ["L", "D"]],
    offset_kernel_sizes=[3, 3, 3, 3],
    num_labels=3,
)


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    torch.manual_seed(0)
    model = DatForImageClassification(DatConfig(**TINY)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "conv_offset.3" in name:
                p.normal_(0, 3.0)  # offsets saturate: some points leave the map
            elif p.dim() > 1:
                p.normal_(0, (2.0 / p[0].numel()) ** 0.5)
    folder = tmp_path_factory.mktemp("dat-fig") / "tiny"
    model.save_pretrained(folder, safe_serialization=True)
    ViTImageProcessor(size={"height": 32, "width": 32}, image_mean=[0.5] * 3, image_std=[0.5] * 3).save_pretrained(
        folder
    )
    return load_model(str(folder))


def _spread(points_norm: np.ndarray, weights: np.ndarray, grid: tuple[int, int]) -> np.ndarray:
    n_h, n_w = grid
    out = np.zeros(n_h * n_w)
    for (y, x), wt in zip(points_norm, weights, strict=True):
        py, px = (y + 1) / 2 * (n_h - 1), (x + 1) / 2 * (n_w - 1)
        y0, x0 = math.floor(py), math.floor(px)
        for r, wy in ((y0, 1 - (py - y0)), (y0 + 1, py - y0)):
            for c, wx in ((x0, 1 - (px - x0)), (x0 + 1, px - x0)):
                if 0 <= r < n_h and 0 <= c < n_w:
                    out[r * n_w + c] += wt * wy * wx
    return out


def test_points_weights_and_references_match_the_model_and_the_record(loaded):
    img = random_image(11)
    samples = deformable_samples(loaded, img)
    cap = capture(loaded, img, attention_dtype="float32")
    assert [s.block for s in samples] == [4, 7] and [s.stage for s in samples] == [2, 3]
    pixels, _ = preprocess(loaded, [img], input_size_for(loaded))
    with torch.no_grad():
        out = loaded.model(pixel_values=pixels, output_sampling=True)
    forward_pos = {4: out.positions[2][0], 7: out.positions[3][1]}
    left = False
    for s in samples:
        n_h, n_w = s.grid
        pos = forward_pos[s.block][0].reshape(s.groups, -1, 2).numpy()  # (G, Ns, 2) y, x
        fx, fy = (pos[..., 1] + 1) / 2 * (n_w - 1), (pos[..., 0] + 1) / 2 * (n_h - 1)
        np.testing.assert_allclose(s.positions, np.stack([(fx + 0.5) * 32 / n_w, (fy + 0.5) * 32 / n_h], -1), atol=1e-4)
        for head in range(s.num_heads):
            for token in (0, n_h * n_w // 2 + 1, n_h * n_w - 1):
                qp = query_points(s, head, token)
                assert qp.weights.sum() == pytest.approx(1.0, abs=1e-5)
                np.testing.assert_allclose(qp.points, s.positions[head // (s.num_heads // s.groups)])
                rebuilt = _spread(s.normalised[head // (s.num_heads // s.groups)], qp.weights, s.grid)
                np.testing.assert_allclose(cap.blocks[s.block].attention[head, token], rebuilt, atol=2e-6)
                assert qp.query == ((token % n_w + 0.5) * 32 / n_w, (token // n_w + 0.5) * 32 / n_h)
                left |= bool((qp.on_map < 1).any())
        # a zero offset samples at (i + 0.5) / n * 2 - 1: feature pixel (i + 0.5)(n - 1) / n
        i = np.arange(n_w)
        expected_x = ((i + 0.5) * (n_w - 1) / n_w + 0.5) * 32 / n_w
        np.testing.assert_allclose(s.references[0, :n_w, 0], expected_x, atol=1e-4)
    assert left  # some sampled points read (partly) outside the map


def test_figure_draws_points_query_and_arrows_on_request(loaded):
    img = random_image(12)
    s = deformable_samples(loaded, img)[0]
    qp = query_points(s, 1, 5)
    image = np.zeros((32, 32, 3), np.uint8)
    plain = deformable_figure(image, qp)
    assert [t.type for t in plain.data] == ["image", "scatter", "scatter"]
    np.testing.assert_allclose(np.asarray(plain.data[1].marker.color), qp.weights)
    np.testing.assert_allclose(plain.data[1].x, qp.points[:, 0])
    assert (plain.data[2].x[0], plain.data[2].y[0]) == qp.query and not plain.layout.annotations
    fig = deformable_figure(image, qp, arrows=True, title="t")
    assert len(fig.layout.annotations) == len(qp.weights) and fig.layout.title.text == "t"
    a = fig.layout.annotations[0]
    assert (a.x, a.y, a.ax, a.ay) == pytest.approx((*qp.points[0], *qp.references[0]))
    lo, hi = fig.layout.xaxis.range
    assert lo <= min(0, qp.points[:, 0].min()) and hi >= max(32, qp.points[:, 0].max())


def test_bad_head_or_query_is_a_message(loaded):
    s = deformable_samples(loaded, random_image(13))[0]
    with pytest.raises(ValueError, match="head 9 does not exist"):
        query_points(s, 9, 0)
    with pytest.raises(ValueError, match="not a token"):
        query_points(s, 0, 10_000)


def test_the_pooled_query_is_the_mean_row_and_has_no_star(loaded):
    img = random_image(14)
    s = deformable_samples(loaded, img)[1]
    qp = query_points(s, 2, POOLED)
    np.testing.assert_allclose(qp.weights, s.attention[2].mean(0))
    assert qp.query is None and qp.weights.sum() == pytest.approx(1.0, abs=1e-5)
    cap = capture(loaded, img, attention_dtype="float32")
    rebuilt = _spread(s.normalised[s.group_of(2)], qp.weights, s.grid)
    np.testing.assert_allclose(cap.blocks[s.block].attention[2].mean(0), rebuilt, atol=2e-6)
    fig = deformable_figure(np.zeros((32, 32, 3), np.uint8), qp)
    assert [t.type for t in fig.data] == ["image", "scatter"]
