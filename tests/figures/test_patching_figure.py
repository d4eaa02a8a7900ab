"""The patching grid figure: colour = change from the clean logit, centred on 0; hover keeps the patched logit."""

import numpy as np

from vitviz.figures.patching import patching_grid_figure


def test_colour_is_the_change_from_clean_and_nan_stays_blank():
    values = np.array([[1.0, 3.0, np.nan], [0.5, 2.0, 2.0]])
    fig = patching_grid_figure(values, clean=2.0, source=-1.0, title="t", x_title="token", marked_row=1)
    heat = fig.data[0]
    np.testing.assert_allclose(np.asarray(heat.z, float), values - 2.0)
    assert heat.zmid == 0.0 and heat.zmin == -1.5 and heat.zmax == 1.5
    assert heat.customdata[0][1][2] == 3.0 and heat.customdata[1][0][0] == "block 1"
    assert "clean 2, source -1" in heat.hovertemplate
    assert fig.layout.shapes[0].y0 == 0.5 and list(fig.layout.yaxis.ticktext) == ["block 0", "block 1"]
