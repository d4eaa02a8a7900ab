"""AttnLRP's CP-LRP variant (lxt's recipe for vision transformers) by name: ``attnlrp_cp`` from the command line and
the app, beside ``attnlrp`` (the paper's rules, the default) (issue 32.19)."""

from __future__ import annotations

import numpy as np
import pytest

from vitviz.__main__ import main
from vitviz.data.shapes import make_sample
from vitviz.methods import METHODS, available_methods, explain, get_method
from vitviz.methods.attnlrp import relevance
from vitviz.methods.base import Inputs, pool_to_grid
from vitviz.models.load import load_model

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def demo():
    return load_model("demo", device="cpu")


def test_the_variant_has_a_name_of_its_own_and_is_not_a_default(demo):
    cp = get_method("attnlrp_cp")
    assert cp.name == "attnlrp_cp" and cp.variant == "cp" and "CP-LRP" in cp.title
    assert get_method("attnlrp").variant == "attnlrp"  # the default stays the paper's rules
    assert "attnlrp_cp" not in METHODS and "attnlrp_cp" not in available_methods(demo)


def test_the_variants_map_is_cp_lrps(demo):
    image = make_sample(7).image
    got = explain(demo, image, "attnlrp_cp", target=4)
    inputs = Inputs(demo, image)
    ref = relevance(demo, inputs.pixels(), inputs.input_size, target=4, variant="cp")
    assert got.method == "attnlrp_cp"
    np.testing.assert_allclose(got.values, pool_to_grid(ref.pixels.sum(axis=0), inputs.grid), rtol=1e-5, atol=1e-7)
    paper = explain(demo, image, "attnlrp", target=4).values
    assert not np.allclose(got.values, paper)


def test_export_writes_the_variant_by_name(tmp_path):
    from PIL import Image

    photo = tmp_path / "s.png"
    make_sample(7).image.save(photo)
    argv = ["export", "--model", "demo", "--methods", "attnlrp,attnlrp_cp", "--out", str(tmp_path / "o"), str(photo)]
    assert main(argv) == 0
    with np.load(tmp_path / "o" / "s.npz") as npz:
        assert {"method_attnlrp", "method_attnlrp_cp"} <= set(npz.files)
        assert not np.allclose(npz["method_attnlrp"], npz["method_attnlrp_cp"])
    Image.open(tmp_path / "o" / "s_rollout.png").verify()


def test_the_command_line_help_names_both_and_the_default(capsys):
    for command in ("export", "evaluate"):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        text = " ".join(capsys.readouterr().out.split())
        assert "attnlrp_cp" in text and "default" in text
