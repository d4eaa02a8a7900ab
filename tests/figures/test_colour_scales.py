"""Colour scales survive Streamlit: no colour may be one of its theme placeholders (#000001..#000010)."""

import json
import re

import numpy as np
import plotly.colors

from vitviz import figures


def test_rgb_scale_keeps_the_named_scale_colour_for_colour():
    named = plotly.colors.get_colorscale("Inferno")
    ours = figures.rgb_scale("Inferno")
    assert [p for p, _ in ours] == [p for p, _ in named]
    assert ours[0][1] == "rgb(0, 0, 4)"  # Inferno's bottom, #000004
    for (_, hex_colour), (_, rgb) in zip(named, ours, strict=True):
        assert rgb == "rgb({}, {}, {})".format(*plotly.colors.hex_to_rgb(hex_colour))


def test_map_figures_carry_no_placeholder_colour_and_full_opacity():
    image = np.zeros((16, 16, 3), np.uint8)
    maps = np.random.default_rng(0).random((3, 4, 4)).astype(np.float32)
    figs = [
        figures.map_figure(image, maps[0], title="t", colorbar_title="c"),
        figures.small_multiples_figure(maps, ["a", "b", "c"], colorbar_title="c", image=image),
        figures.layer_head_figure(maps[0], title="t", colorbar_title="c"),
    ]
    for fig in figs:  # the figure's own colours (Streamlit's registered template carries placeholders on purpose)
        own = fig.to_plotly_json()
        own["layout"].pop("template", None)
        assert not re.search(r"#0000(0[1-9a-f]|10)\b", json.dumps(own, default=str), re.I)
    heat = [t for f in figs[:2] for t in f.data if t.type == "heatmap"]
    assert [t.opacity for t in heat] == [1.0, 1.0]
    assert heat[0].colorscale[0][1] == "rgb(0, 0, 4)"
