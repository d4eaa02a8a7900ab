"""``convert --arch vit-npz``: the ViT paper's JAX checkpoints, checked against that code's forward written in numpy.

Every checkpoint here is written by ``jax_vit.tiny_arrays`` in the layout ``vit_jax`` saves, and
every logit is compared with ``jax_vit.jax_forward``, a float64 transcription of the JAX modules
that never touches vitviz: the converter's key mapping, transposes and the model's conventions
(weight standardisation, group norm, padding, GELU, LayerNorm epsilon, position-grid resizing)
are checked against it, not against themselves.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from jax_vit import LINEN, jax_forward, tiny_arrays, write_npz

from vitviz.__main__ import main
from vitviz.models.load import load_model
from vitviz.zoo.convert import ConvertError
from vitviz.zoo.vit_npz import VARIANTS, convert_vit_npz, variant_in_name

pytestmark = pytest.mark.usefixtures("one_thread")

# A float64 copy of the converted model against the float64 reference (logits of size ~10); transformers' eager
# attention computes its softmax in float32, hence not 1e-12. The model as loaded (float32): FLOAT32_TOL.
TOL = dict(rtol=1e-6, atol=3e-5)
FLOAT32_TOL = dict(rtol=1e-4, atol=3e-3)


def _logits(loaded, x: np.ndarray, *, float32: bool = False) -> np.ndarray:
    """The converted model's logits (the pooled output of a backbone), in a float64 copy unless ``float32``."""
    model = loaded.model if float32 else copy.deepcopy(loaded.model).double()
    with torch.no_grad():
        out = model(pixel_values=torch.from_numpy(x).to(torch.float32 if float32 else torch.float64))
    return (out.logits if hasattr(out, "logits") else out.pooler_output).double().numpy()


def _pixels(seed: int, h: int, w: int, scale: float = 1.0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((2, 3, h, w)) * scale


def _nothing_written(tmp_path: Path, out: Path) -> None:
    assert not out.exists()
    assert not [p for p in out.parent.iterdir() if p.name.startswith(".")]  # no temporary folder left behind


def _convert(tmp_path: Path, arrays: dict, name: str = "tiny.npz", **kw):
    path = write_npz(tmp_path / name, arrays)
    out = tmp_path / f"{Path(name).stem}-out"
    return convert_vit_npz(path, out, **kw), out


# --- plain ViTs -> transformers' ViT ----------------------------------------------------------------------------


def test_a_plain_vit_becomes_an_hf_vit_with_the_jax_logits(tmp_path):
    arrays = tiny_arrays(seed=1)
    report, out = _convert(tmp_path, arrays)
    assert report.model_class == "ViTForImageClassification" and report.layout.image_size == 32
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "vit" and config["hidden_act"] == "gelu_pytorch_tanh"
    assert config["layer_norm_eps"] == 1e-6 and config["patch_size"] == 8
    proc = json.loads((out / "preprocessor_config.json").read_text())
    assert proc["image_mean"] == [0.5] * 3 and proc["image_std"] == [0.5] * 3  # the paper's, not ImageNet's
    loaded = load_model(str(out), device="cpu")
    assert loaded.family.name == "ViT" and loaded.default_size == (32, 32) and len(loaded.id2label) == 5
    x = _pixels(0, 32, 32)
    np.testing.assert_allclose(_logits(loaded, x), jax_forward(arrays, x), **TOL)
    np.testing.assert_allclose(_logits(loaded, x, float32=True), jax_forward(arrays, x), **FLOAT32_TOL)


def test_the_tolerance_tells_the_two_gelus_apart(tmp_path):
    """The tolerance is tight enough to see exact GELU (HF ViT's default) in place of flax's tanh approximation."""
    arrays = tiny_arrays(seed=2)
    _, out = _convert(tmp_path, arrays)
    loaded = load_model(str(out), device="cpu")
    x = _pixels(1, 32, 32)
    want = jax_forward(arrays, x)
    for layer in loaded.model.vit.layers:
        layer.mlp.activation_fn = torch.nn.GELU()  # exact
    assert np.abs(_logits(loaded, x) - want).max() > 10 * TOL["atol"]


def test_a_384_fine_tune_keeps_its_resized_position_grid(tmp_path):
    """The 384-px fine-tunes carry a 24 x 24 table (resized by the authors before fine-tuning): the input size is
    the grid times the patch, here 6 x 8 = 48 px, and the model runs there without interpolation."""
    arrays = tiny_arrays(seed=3, grid=6)
    report, out = _convert(tmp_path, arrays, name="tiny-res_384.npz")
    assert report.layout.image_size == 48 and report.variant is None
    loaded = load_model(str(out), device="cpu")
    assert loaded.default_size == (48, 48) and loaded.position_grid == (6, 6)
    x = _pixels(2, 48, 48)
    np.testing.assert_allclose(_logits(loaded, x), jax_forward(arrays, x), **TOL)


def test_linen_numbering_is_read_too(tmp_path):
    arrays = tiny_arrays(seed=4, names=LINEN)
    _, out = _convert(tmp_path, arrays)
    x = _pixels(3, 32, 32)
    np.testing.assert_allclose(
        _logits(load_model(str(out), device="cpu"), x), jax_forward(arrays, x, names=LINEN), **TOL
    )


# --- pre_logits: kept in vitviz's own class ----------------------------------------------------------------------


def test_a_representation_layer_is_kept_not_dropped(tmp_path, capsys):
    """ImageNet-21k checkpoints read CLS through tanh(pre_logits) before the head; HF ViT has no such layer, so
    the weights go to the zoo class, which keeps it (and says so)."""
    arrays = tiny_arrays(seed=5, representation=16, classes=7)
    path = write_npz(tmp_path / "ViT-tiny-21k.npz", arrays)
    out = tmp_path / "out"
    assert main(["convert", "--arch", "vit-npz", "--checkpoint", str(path), "--out", str(out)]) == 0
    io = capsys.readouterr()
    assert "HybridViTForImageClassification" in io.out and "pre_logits" in io.err
    loaded = load_model(str(out), device="cpu")
    assert loaded.config.model_type == "hybrid_vit" and loaded.config.representation_size == 16
    assert not loaded.config.has_resnet and "pixel patches" in loaded.family.token_note(loaded.config)
    x = _pixels(4, 32, 32)
    np.testing.assert_allclose(_logits(loaded, x), jax_forward(arrays, x), **TOL)


def test_a_checkpoint_without_head_becomes_a_backbone(tmp_path):
    arrays = tiny_arrays(seed=6, classes=None, representation=12)
    report, out = _convert(tmp_path, arrays)
    assert report.model_class == "HybridViTModel"
    loaded = load_model(str(out), device="cpu")
    assert not loaded.has_classifier
    x = _pixels(5, 32, 32)
    np.testing.assert_allclose(_logits(loaded, x), jax_forward(arrays, x), **TOL)


# --- hybrids ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("resnet,grid", [((1, 2), 4), ((1, 1, 2), 3)])
def test_a_hybrid_gives_the_jax_logits(tmp_path, resnet, grid):
    arrays = tiny_arrays(seed=7, resnet=resnet, patch=1, grid=grid)
    report, out = _convert(tmp_path, arrays)
    stride = 4 * 2 ** (len(resnet) - 1)
    assert report.model_class == "HybridViTForImageClassification" and report.layout.resnet_depths == resnet
    loaded = load_model(str(out), device="cpu")
    assert loaded.family.name == "Hybrid ViT" and loaded.patch_size == stride
    assert loaded.default_size == (grid * stride,) * 2
    x = _pixels(6, grid * stride, grid * stride)
    np.testing.assert_allclose(_logits(loaded, x), jax_forward(arrays, x), **TOL)
    np.testing.assert_allclose(_logits(loaded, x, float32=True), jax_forward(arrays, x), **FLOAT32_TOL)


def test_a_hybrid_at_an_odd_size_pads_and_resizes_as_jax(tmp_path):
    """44 x 36 px: every "SAME" layer pads asymmetrically (TF's rule) and the 4 x 4 table is zoomed to the 6 x 5 map
    as vit_jax's interpolate_posembed does (scipy.ndimage.zoom, order 1)."""
    pytest.importorskip("scipy")
    arrays = tiny_arrays(seed=8, resnet=(1, 2), patch=1, grid=4)
    _, out = _convert(tmp_path, arrays)
    loaded = load_model(str(out), device="cpu")
    x = _pixels(7, 44, 36)
    got = _logits(loaded, x)
    np.testing.assert_allclose(got, jax_forward(arrays, x), **TOL)


def test_weight_standardisation_and_group_norm_follow_the_jax_code(tmp_path):
    """Small kernels and a low-contrast image make the epsilons matter: BiT's standardisation (sqrt(var + 1e-8)) or
    its group-norm eps (1e-5) would be far off; the JAX code's ((w - mean) / (std + 1e-5), eps 1e-6) is exact."""
    from transformers.models.bit.modeling_bit import BitGroupNormActivation

    from vitviz.zoo.hybrid import JaxStdConv2d

    arrays = tiny_arrays(seed=9, resnet=(1, 2), patch=1, grid=4)
    for k in arrays:
        if k.startswith(("block", "conv_root")) and k.endswith("/kernel"):
            arrays[k] = arrays[k] * 1e-3
    _, out = _convert(tmp_path, arrays)
    loaded = load_model(str(out), device="cpu")
    x = _pixels(8, 32, 32, scale=1e-4)
    want = jax_forward(arrays, x)
    np.testing.assert_allclose(_logits(loaded, x), want, **TOL)
    gns = [m for m in loaded.model.modules() if isinstance(m, BitGroupNormActivation)]
    convs = [m for m in loaded.model.modules() if isinstance(m, JaxStdConv2d)]
    assert gns and convs and all(m.eps == 1e-6 for m in gns) and all(m.eps == 1e-5 for m in convs)
    try:
        for m in gns:
            m.eps = 1e-5
        assert np.abs(_logits(loaded, x) - want).max() > 100 * TOL["atol"]
        for m in gns:
            m.eps = 1e-6
        for m in convs:
            m.eps = 1e-8
        assert np.abs(_logits(loaded, x) - want).max() > 100 * TOL["atol"]
    finally:
        for m in convs:
            m.eps = 1e-5


def test_old_flax_group_norm_shapes_are_read(tmp_path):
    """Checkpoints saved by flax before 0.3.6 keep group-norm parameters as (1, 1, 1, C) (vit_jax's _fix_groupnorm)."""
    arrays = tiny_arrays(seed=10, resnet=(1, 2), patch=1, grid=4)
    old = {k: (v.reshape(1, 1, 1, -1) if "/gn" in f"/{k}" else v) for k, v in arrays.items()}
    assert old["gn_root/scale"].shape == (1, 1, 1, 32)
    _, out = _convert(tmp_path, old)
    x = _pixels(9, 32, 32)
    np.testing.assert_allclose(_logits(load_model(str(out), device="cpu"), x), jax_forward(arrays, x), **TOL)


def test_the_feature_map_is_the_jax_resnets(tmp_path):
    """The map the model hands back (Grad-CAM's layer) is the JAX ResNet's output, NHWC -> NCHW."""
    arrays = tiny_arrays(seed=11, resnet=(1, 2), patch=1, grid=4)
    _, out = _convert(tmp_path, arrays)
    loaded = load_model(str(out), device="cpu")
    x = _pixels(10, 32, 32)
    _, fmap = jax_forward(arrays, x, feature_map=True)
    with torch.no_grad():
        got = copy.deepcopy(loaded.model).double()(pixel_values=torch.from_numpy(x), output_feature_map=True)
    np.testing.assert_allclose(got.feature_map.numpy(), fmap.transpose(0, 3, 1, 2), rtol=1e-9, atol=1e-9)


# --- names ----------------------------------------------------------------------------------------------------


def test_published_file_names_are_recognised():
    assert variant_in_name("R50+ViT-B_16.npz").resnet_depths == (3, 4, 9)
    assert variant_in_name("imagenet21k_R50+ViT-B_16.npz").name == "R50+ViT-B_16"
    assert variant_in_name("ViT-B_16-224.npz").name == "ViT-B_16"
    augreg = "R26_S_32-i21k-300ep-lr_0.001-aug_light0-wd_0.03-do_0.1-sd_0.1--imagenet2012-steps_20k-lr_0.03-res_384.npz"
    assert variant_in_name(augreg).resnet_depths == (2, 2, 2, 2) and variant_in_name(augreg).hidden_size == 384
    assert variant_in_name("R_Ti_16-i21k-300ep-lr_0.001-aug_none-wd_0.03-do_0.0-sd_0.0.npz").name == "R_Ti_16"
    assert variant_in_name("Ti_16-i21k-300ep-lr_0.001-aug_none-wd_0.03-do_0.0-sd_0.0.npz").name == "Ti_16"
    assert variant_in_name("my-model.npz") is None
    assert {"R50+ViT-B_16", "R26+ViT-S_32", "R26_S_32", "ViT-L_32", "B_16"} <= set(VARIANTS)


# --- bad input: a message naming the mismatch, nothing written ----------------------------------------------------


def _cli_refuses(tmp_path, capsys, path: Path, *extra: str) -> str:
    out = tmp_path / "refused"
    code = main(["convert", "--arch", "vit-npz", "--checkpoint", str(path), "--out", str(out), *extra])
    err = capsys.readouterr().err
    assert code in (1, 2) and "Traceback" not in err, err
    _nothing_written(tmp_path, out)
    return err


def test_object_arrays_are_refused(tmp_path, capsys):
    arrays = tiny_arrays(seed=12)
    path = tmp_path / "pickled.npz"
    np.savez(path, **arrays, note=np.array([{"run": "code"}], dtype=object))
    assert "object arrays" in _cli_refuses(tmp_path, capsys, path)


def test_a_file_that_is_not_a_vit_checkpoint_is_refused(tmp_path, capsys):
    mixer = {
        "stem/kernel": np.zeros((16, 16, 3, 8), np.float32),
        "MixerBlock_0/LayerNorm_0/scale": np.ones(8, np.float32),
    }
    err = _cli_refuses(tmp_path, capsys, write_npz(tmp_path / "mixer.npz", mixer))
    assert "not a checkpoint of the ViT paper's JAX code" in err and "Mixer" in err
    junk = tmp_path / "junk.npz"
    junk.write_bytes(b"\x00" * 64)
    assert "not a .npz file" in _cli_refuses(tmp_path, capsys, junk)
    ints = {**tiny_arrays(seed=13), "head/bias": np.arange(5)}
    assert "not floating point" in _cli_refuses(tmp_path, capsys, write_npz(tmp_path / "ints.npz", ints))
    gap = {k: v for k, v in tiny_arrays(seed=13).items() if k != "cls"}
    assert "'gap'" in _cli_refuses(tmp_path, capsys, write_npz(tmp_path / "gap.npz", gap))


def test_a_damaged_file_is_refused(tmp_path, capsys):
    path = write_npz(tmp_path / "damaged.npz", tiny_arrays(seed=14))
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0x01  # one flipped bit inside some array's data
    path.write_bytes(bytes(raw))
    assert "damaged" in _cli_refuses(tmp_path, capsys, path)


def test_hybrid_depths_that_contradict_the_model_name_are_named(tmp_path, capsys):
    """A file called R50+ViT-B_16 whose ResNet has (1, 2) units: the message names both depths."""
    arrays = tiny_arrays(seed=15, resnet=(1, 2), patch=1, grid=4)
    err = _cli_refuses(tmp_path, capsys, write_npz(tmp_path / "R50+ViT-B_16.npz", arrays))
    assert (
        "does not match R50+ViT-B_16" in err and "ResNet depths (3, 4, 9) in R50+ViT-B_16, (1, 2) in the arrays" in err
    )
    err = _cli_refuses(tmp_path, capsys, write_npz(tmp_path / "mine.npz", arrays), "--variant", "R26+ViT-S_32")
    assert "ResNet depths (2, 2, 2, 2) in R26+ViT-S_32, (1, 2) in the arrays" in err and "(--variant)" in err
    err = _cli_refuses(
        tmp_path, capsys, write_npz(tmp_path / "plain.npz", tiny_arrays(seed=15)), "--variant", "R50+ViT-B_16"
    )
    assert "none (no ResNet) in the arrays" in err


def test_a_resnet_with_a_missing_unit_is_refused(tmp_path, capsys):
    arrays = tiny_arrays(seed=16, resnet=(1, 3), patch=1, grid=4)
    gone = {k: v for k, v in arrays.items() if not k.startswith("block2/unit2/")}
    err = _cli_refuses(tmp_path, capsys, write_npz(tmp_path / "gap-unit.npz", gone))
    assert "missing" in err and "block2/unit2/conv1/kernel" in err


def test_an_imagenet21k_checkpoint_asked_for_1000_classes_is_refused(tmp_path, capsys):
    arrays = tiny_arrays(seed=17, hidden=8, heads=2, mlp=8, representation=8, classes=21843)
    path = write_npz(tmp_path / "i21k.npz", arrays)
    err = _cli_refuses(tmp_path, capsys, path, "--num-classes", "1000")
    assert "21843 classes (the ImageNet-21k label set)" in err and "asks for 1000" in err
    labels = tmp_path / "imagenet.txt"
    labels.write_text("\n".join(f"class {i}" for i in range(1000)))
    assert "--labels asks for 1000" in _cli_refuses(tmp_path, capsys, path, "--labels", str(labels))


def test_arrays_that_do_not_belong_missing_or_of_another_shape_are_named(tmp_path, capsys):
    arrays = tiny_arrays(seed=18)
    extra = {**arrays, "Transformer/encoderblock_0/LayerScale_0/scale": np.ones(32, np.float32)}
    err = _cli_refuses(tmp_path, capsys, write_npz(tmp_path / "extra.npz", extra))
    assert "do not belong" in err and "LayerScale_0/scale" in err
    short = {k: v for k, v in arrays.items() if k != "Transformer/encoderblock_1/LayerNorm_2/bias"}
    assert "encoderblock_1/LayerNorm_2/bias" in _cli_refuses(tmp_path, capsys, write_npz(tmp_path / "short.npz", short))
    wrong = {**arrays, "Transformer/encoderblock_1/MlpBlock_3/Dense_1/bias": np.zeros(31, np.float32)}
    err = _cli_refuses(tmp_path, capsys, write_npz(tmp_path / "wrong.npz", wrong))
    assert "Dense_1/bias: (31,) in the file, (32,) expected" in err


def test_non_finite_values_are_refused(tmp_path, capsys):
    arrays = tiny_arrays(seed=19, resnet=(1, 2), patch=1, grid=4)
    arrays["block2/unit1/conv2/kernel"][0, 0, 0, 0] = np.nan
    assert "NaN or infinite" in _cli_refuses(tmp_path, capsys, write_npz(tmp_path / "nan.npz", arrays))


def test_options_are_checked(tmp_path, capsys):
    path = write_npz(tmp_path / "ok.npz", tiny_arrays(seed=20))
    assert "Unknown --variant" in _cli_refuses(tmp_path, capsys, path, "--variant", "ViT-Q_99")
    assert "--num-classes" in _cli_refuses(tmp_path, capsys, path, "--num-classes", "0")
    out = tmp_path / "cct-out"
    code = main(
        ["convert", "--arch", "cct_7_3x1_32", "--checkpoint", str(path), "--out", str(out), "--variant", "B_16"]
    )
    assert code == 2 and "apply to --arch vit-npz only" in capsys.readouterr().err
    full = tmp_path / "full"
    full.mkdir()
    (full / "x").write_text("x")
    with pytest.raises(ConvertError, match="not empty"):
        convert_vit_npz(path, full)
