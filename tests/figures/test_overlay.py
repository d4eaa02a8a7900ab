"""Overlays at photo resolution: pixels against hand computations and torch's own bilinear interpolation."""

import base64
import io

import numpy as np
import pytest
import torch
from PIL import Image

from vitviz.figures.overlay import (
    COLORSCALE,
    MAX_EXPORT_SIDE,
    colorize,
    colour_limits,
    export_size,
    fit_photo,
    image_config,
    overlay,
    photo_overlay,
    photo_overlay_figure,
    png_bytes,
    upsample,
)


def _rgb(hex_colour: str) -> list[int]:
    return [int(hex_colour[i : i + 2], 16) for i in (1, 3, 5)]


def test_nearest_gives_each_pixel_the_cell_its_centre_falls_in():
    m = np.arange(6, dtype=np.float32).reshape(2, 3)
    up = upsample(m, (5, 7), mode="nearest")  # cells of 2.5 x 2.33 px: no integer ratio
    assert up.shape == (5, 7) and up.dtype == np.float32
    for y in range(5):
        for x in range(7):
            r, c = int((y + 0.5) * 2 / 5), int((x + 0.5) * 3 / 7)
            assert up[y, x] == m[r, c]
    # by hand: rows 0, 1 -> cell row 0; rows 2 (centre 2.5: the boundary), 3, 4 -> cell row 1
    np.testing.assert_array_equal(up[:, 0], [0, 0, 3, 3, 3])
    np.testing.assert_array_equal(up[0], [0, 0, 1, 1, 1, 2, 2])  # column cells [0, 2.33), [2.33, 4.67), ...


def test_bilinear_is_torch_interpolate_half_pixel():
    rng = np.random.default_rng(0)
    m = rng.random((3, 4)).astype(np.float32)
    for size in ((12, 16), (7, 50), (300, 211)):
        ref = torch.nn.functional.interpolate(
            torch.from_numpy(m)[None, None], size=size, mode="bilinear", align_corners=False
        )[0, 0].numpy()
        np.testing.assert_allclose(upsample(m, size, mode="bilinear"), ref, atol=1e-6)
    # by hand, 1 x 2 -> 1 x 4: source x = (x + 0.5) / 2 - 0.5 = -0.25, 0.25, 0.75, 1.25, clamped to [0, 1]
    np.testing.assert_allclose(upsample(np.array([[0.0, 4.0]]), (1, 4), mode="bilinear"), [[0, 1, 3, 4]])
    with pytest.raises(ValueError, match="nearest"):
        upsample(m, (4, 4), mode="cubic")


def test_colour_limits_per_map_and_shared():
    a, b = np.array([[1.0, 3.0]]), np.array([[0.5, np.nan], [2.0, 2.5]])
    assert colour_limits([a, b]) == [(1.0, 3.0), (0.5, 2.5)]
    assert colour_limits([a, b], scale="shared") == [(0.5, 3.0), (0.5, 3.0)]
    assert colour_limits([np.full((2, 2), np.nan)]) == [(0.0, 0.0)]
    with pytest.raises(ValueError):
        colour_limits([a], scale="global")


def test_export_size_is_the_photos_own_up_to_2048_on_the_long_side():
    assert MAX_EXPORT_SIDE == 2048
    assert export_size((640, 480)) == (640, 480)
    assert export_size((4000, 3000)) == (2048, 1536)
    assert export_size((1000, 5000)) == (410, 2048)  # 1000 * 2048 / 5000 = 409.6
    assert export_size((5000, 1000), max_side=100) == (100, 20)
    photo = Image.new("RGB", (3000, 1500), (10, 20, 30))
    fitted = fit_photo(photo)
    assert fitted.shape == (1024, 2048, 3) and (fitted[5, 5] == [10, 20, 30]).all()


def test_photo_overlay_pixels_by_hand():
    photo = np.zeros((4, 6, 3), np.uint8)
    photo[..., 0] = 200  # a red photo
    m = np.array([[0.0, 1.0], [2.0, 4.0]])  # own limits 0..4: normalised 0, 0.25, 0.5, 1
    out = photo_overlay(photo, m, mode="nearest", opacity=0.5)
    assert out.shape == (4, 6, 3) and out.dtype == np.uint8
    top = np.array(_rgb(COLORSCALE[-1]), float)  # 1.0 -> the last stop
    bottom = np.array(_rgb(COLORSCALE[0]), float)
    np.testing.assert_array_equal(out[3, 5], np.round(0.5 * np.array([200, 0, 0]) + 0.5 * top))
    np.testing.assert_array_equal(out[0, 0], np.round(0.5 * np.array([200, 0, 0]) + 0.5 * bottom))
    # 0.25 of the scale: 9 * 0.25 = 2.25 -> 3/4 of stop 2 and 1/4 of stop 3
    quarter = np.round(0.75 * np.array(_rgb(COLORSCALE[2]), float) + 0.25 * np.array(_rgb(COLORSCALE[3]), float))
    np.testing.assert_array_equal(out[0, 4], np.round(0.5 * np.array([200, 0, 0]) + 0.5 * quarter))
    # threshold 0.5: the cells at 0 and 0.25 show the photo itself, 0.5 and 1 are coloured
    thr = photo_overlay(photo, m, mode="nearest", opacity=0.5, threshold=0.5)
    np.testing.assert_array_equal(thr[:2], photo[:2])
    np.testing.assert_array_equal(thr[2:], out[2:])
    # shared limits 0..8: the top cell is at the scale's middle, not its top
    shared = photo_overlay(photo, m, limits=(0.0, 8.0), mode="nearest", opacity=1.0)
    np.testing.assert_array_equal(shared[3, 5], colorize(np.array([[0.5]]))[0, 0])
    # a flat map is drawn at the bottom of the scale, not stretched
    flat = photo_overlay(photo, np.ones((2, 2)), opacity=1.0)
    assert (flat == np.array(_rgb(COLORSCALE[0]))).all()
    # the caller's arrays are not changed; opacity 0 is the photo
    assert (photo[..., 0] == 200).all() and m[1, 1] == 4.0
    np.testing.assert_array_equal(photo_overlay(photo, m, opacity=0.0), photo)
    with pytest.raises(ValueError, match="RGB"):
        photo_overlay(photo[..., 0], m)


def test_overlay_keeps_its_old_meaning_and_png_round_trips():
    rng = np.random.default_rng(1)
    image = rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)
    m = rng.random((4, 4))
    img = overlay(image, m, alpha=0.6)
    v = upsample((m - m.min()) / (m.max() - m.min()), (32, 32), mode="bilinear")
    expected = np.round(0.4 * image + 0.6 * colorize(v).astype(float)).astype(np.uint8)
    np.testing.assert_array_equal(np.asarray(img), expected)
    back = np.asarray(Image.open(io.BytesIO(png_bytes(img))))
    np.testing.assert_array_equal(back, expected)


def test_photo_overlay_figure_and_its_download_size():
    composite = np.zeros((300, 3000, 3), np.uint8)
    fig = photo_overlay_figure(composite, limits=(0.1, 0.7), colorbar_title="rollout (raw)", title="t")
    image, bar = fig.data
    assert image.type == "image" and bar.type == "scatter"
    # sent at 1024 px wide, drawn over 3000 x 300 axis units
    sent = Image.open(io.BytesIO(base64.b64decode(image.source.split(",", 1)[1])))
    assert sent.size == (1024, 102)
    assert image.dx == pytest.approx(3000 / 1024) and image.x0 == pytest.approx(3000 / 1024 / 2)
    assert (bar.marker.cmin, bar.marker.cmax) == (0.1, 0.7) and bar.marker.showscale
    assert bar.marker.colorscale[0][1] == COLORSCALE[0] and bar.marker.colorbar.title.text == "rollout (raw)"
    assert tuple(fig.layout.xaxis.range) == (0, 3000) and tuple(fig.layout.yaxis.range) == (300, 0)
    cfg = image_config((3000, 300), filename="rollout", fmt="svg")["toImageButtonOptions"]
    assert (cfg["width"], cfg["height"], cfg["format"], cfg["filename"]) == (2048, 205, "svg", "rollout")
