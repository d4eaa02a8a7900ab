"""Converted checkpoints score like their originals on any photo (issue 32.19): the folder carries the original's
evaluation (short side resized, centre crop) and vitviz honours it; the maps then cover the crop. Also: open_clip
3.x's custom-block options are refused by name."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image

from tests.zoo.test_open_clip import CFG, _folder, _open_clip_logits, _open_clip_state
from vitviz.__main__ import main
from vitviz.capture.forward import crop_box, input_size_for, preprocess, seen_part
from vitviz.models.load import load_model
from vitviz.zoo.open_clip import convert_open_clip

pytestmark = pytest.mark.usefixtures("one_thread")

MEAN = STD = (0.5, 0.5, 0.5)


def _open_clip_eval(image: Image.Image, size: int, short: int | None = None, mean=MEAN, std=STD) -> torch.Tensor:
    """open_clip's (and timm's) eval transform written out from torchvision's rules: ``Resize(short)`` (bicubic; the
    short side becomes ``short``, the long one ``int(short * long / short_side)``), ``CenterCrop(size)`` (offsets
    ``int(round((side - size) / 2.0))``), ``ToTensor``, ``Normalize``: ``(1, 3, size, size)``."""
    short = size if short is None else short
    w, h = image.size
    nw, nh = (short, int(short * h / w)) if w <= h else (int(short * w / h), short)
    big = image.convert("RGB").resize((nw, nh), Image.BICUBIC)
    left, top = round((nw - size) / 2.0), round((nh - size) / 2.0)  # torchvision: int(round(...))
    x = np.asarray(big, np.float32)[top : top + size, left : left + size] / 255.0
    x = (x - np.array(mean, np.float32)) / np.array(std, np.float32)
    return torch.from_numpy(x).permute(2, 0, 1)[None]


def _ids(loaded, prompts) -> torch.Tensor:
    rows = [loaded.text.tokenizer(p)["input_ids"] for p in prompts]
    ids = torch.zeros(len(rows), CFG["text_cfg"]["context_length"], dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(r)
    return ids


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("oc")
    folder, state = _folder(tmp)
    convert_open_clip(folder, tmp / "hf")
    return tmp / "hf", state


def test_the_converted_folder_says_how_open_clip_evaluates(converted):
    out, _ = converted
    proc = json.loads((out / "preprocessor_config.json").read_text())
    assert proc["do_center_crop"] is True and proc["size"] == {"shortest_edge": 32}
    assert proc["crop_size"] == {"height": 32, "width": 32} and proc["resample"] == 3
    assert json.loads((out / "vitviz.json").read_text())["center_crop"] is True
    assert load_model(str(out)).center_crop == (32, 32)


@pytest.mark.parametrize("wh", [(48, 32), (32, 51), (37, 70)])
def test_a_non_square_photo_scores_as_open_clip_scores_it(converted, wh):
    """The zero-shot logits of a wide or tall photo equal open_clip's (its eval transform, then its formula)."""
    from vitviz.capture.forward import capture
    from vitviz.models.zeroshot import encode_labels, parse_labels, score

    out, state = converted
    loaded = load_model(str(out))
    image = Image.fromarray(np.random.default_rng(sum(wh)).integers(0, 255, (wh[1], wh[0], 3), dtype=np.uint8))
    x = _open_clip_eval(image, 32)
    pixels, _ = preprocess(loaded, [image], input_size_for(loaded, None, image.size))
    np.testing.assert_allclose(pixels.numpy(), x.numpy(), atol=1e-5)  # what open_clip's transform gives
    labels = parse_labels("cat, dog, red car", "a photo of a {}.")
    ref = _open_clip_logits(state, CFG, x, _ids(loaded, labels.prompts))[0]
    cap = capture(loaded, image)
    got = score(loaded.model, loaded.text, cap.image_embedding, encode_labels(loaded.model, loaded.text, labels))
    np.testing.assert_allclose(got.logits, ref, rtol=1e-4, atol=1e-4)
    squashed = _open_clip_logits(
        state, CFG, _open_clip_eval(image.resize((32, 32), Image.BICUBIC), 32), _ids(loaded, labels.prompts)
    )[0]
    assert np.abs(squashed - ref).max() > 1e-3  # the crop matters here: squashing the photo scores differently


def test_the_map_covers_the_crop_and_the_photo_is_cut_alike(converted):
    out, _ = converted
    loaded = load_model(str(out))
    photo = Image.fromarray(np.random.default_rng(1).integers(0, 255, (40, 80, 3), dtype=np.uint8))
    hw = input_size_for(loaded, None, photo.size)
    assert crop_box(loaded, photo.size, hw) == (64, 32, 16, 0, 48, 32)  # 80 x 40 -> 64 x 32, the centre 32 x 32
    part = seen_part(loaded, photo, hw)
    assert part.size == (40, 40) and np.array_equal(np.asarray(part), np.asarray(photo)[:, 20:60])
    _, seen = preprocess(loaded, [photo], hw)
    expected = np.asarray(photo.resize((64, 32), loaded.resample))[:, 16:48]
    assert np.array_equal(seen[0], expected)


def test_models_without_the_declaration_still_see_the_whole_image():
    loaded = load_model("demo")
    assert loaded.center_crop is None
    photo = Image.new("RGB", (80, 40))
    assert crop_box(loaded, photo.size, (96, 96)) == (96, 96, 0, 0, 96, 96)
    assert seen_part(loaded, photo, (96, 96)) is photo


def test_open_clips_squash_mode_is_kept(tmp_path):
    folder, _ = _folder(tmp_path)
    cfg = json.loads((folder / "open_clip_config.json").read_text())
    cfg["preprocess_cfg"]["resize_mode"] = "squash"
    (folder / "open_clip_config.json").write_text(json.dumps(cfg))
    convert_open_clip(folder, tmp_path / "hf")
    assert not (tmp_path / "hf" / "vitviz.json").exists()
    assert load_model(str(tmp_path / "hf")).center_crop is None


@pytest.mark.parametrize(
    "option", ["qk_norm", "scaled_cosine_attn", "scale_heads", "scale_attn", "scale_fc", "scale_attn_inner"]
)
def test_open_clip_custom_block_options_are_refused_by_name(tmp_path, capsys, option):
    """Issue 32.19: the refusal listed parameter names (ln_q.weight, ...), not the option that made them."""
    cfg = {**CFG, "vision_cfg": {**CFG["vision_cfg"], option: True}}
    state = {**_open_clip_state(CFG), "visual.transformer.resblocks.0.attn.ln_q.weight": torch.ones(8)}
    folder, _ = _folder(tmp_path, cfg, state=state)
    out = tmp_path / "hf"
    assert main(["convert", "--arch", "open_clip", "--checkpoint", str(folder), "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert option in err and "ln_q" not in err and "keys it does not describe" not in err, err
    assert not out.exists()


def test_the_zoo_converters_write_their_authors_crop(tmp_path):
    """CCT, T2T-ViT and DAT were squashed to their input; their authors evaluate a centre crop."""
    from tests.zoo.test_cct import _official
    from vitviz.capture.forward import capture
    from vitviz.zoo.convert import convert, converter_for

    # timm's floor(size / crop_pct): CCT on ImageNet and T2T-ViT 0.9; DAT int(256 / 224 * size); CIFAR 1.0
    expected = {"cct_14_7x2_224": 248, "cct_14_7x2_384": 426, "t2t_vit_14": 248, "dat_tiny": 256}
    expected |= {"dat_base_384": 438, "cct_7_3x1_32": None, "cct_7_7x2_224_sine": None}
    assert {name: converter_for(name).shortest_edge for name in expected} == expected
    official = _official("cct_7_3x1_32")
    ckpt = tmp_path / "cct.pth"
    torch.save(official.state_dict(), ckpt)
    loaded = load_model(str(convert("cct_7_3x1_32", ckpt, tmp_path / "out")), device="cpu")
    assert loaded.center_crop == (32, 32)
    photo = Image.fromarray(np.random.default_rng(3).integers(0, 255, (32, 53, 3), dtype=np.uint8))
    x = _open_clip_eval(photo, 32, mean=loaded.image_mean, std=loaded.image_std)  # timm's eval, crop_pct 1.0
    pixels, seen = preprocess(loaded, [photo], (32, 32))
    np.testing.assert_allclose(pixels.numpy(), x.numpy(), atol=1e-5)
    with torch.no_grad():  # the tiny random CCT turns 1e-7 of input into 1e-2 of logit: compare on one input
        want = official(pixels).numpy()[0]
    np.testing.assert_allclose(capture(loaded, photo).logits, want, rtol=1e-4, atol=1e-4)
    assert not np.array_equal(seen[0], np.asarray(photo.resize((32, 32), Image.BICUBIC)))  # not squashed


def test_export_draws_the_map_over_the_crop_the_model_saw(converted, tmp_path):
    from vitviz.export import export_images

    out, _ = converted
    loaded = load_model(str(out))
    photo = tmp_path / "wide.png"
    Image.fromarray(np.random.default_rng(2).integers(0, 255, (40, 80, 3), dtype=np.uint8)).save(photo)
    report = export_images(loaded, [photo], tmp_path / "x")
    assert report.written and not report.failed
    png = next((tmp_path / "x").glob("wide_*.png"))
    assert Image.open(png).size == (40, 40)  # the centre square of the 80 x 40 photo, not the whole photo
