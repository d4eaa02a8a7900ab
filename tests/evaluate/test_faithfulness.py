"""Deletion and insertion against a brute-force, unbatched reading of ``docs/definitions.md#faithfulness``."""

import math

import numpy as np
import pytest
import scipy.ndimage
import torch
from conftest import random_image
from PIL import Image

from vitviz.data.shapes import make_sample
from vitviz.demo.vit import peak_in_box as demo_peak_in_box
from vitviz.evaluate import Faithfulness, FaithfulnessError, Perturbations, evaluate_methods, faithfulness
from vitviz.evaluate.faithfulness import (
    curve_steps,
    gaussian_blur,
    insertion_start_image,
    patch_order,
    peak_in_box,
    trapezoid_area,
)
from vitviz.insertion_starts import DEFAULT_INSERTION_START
from vitviz.methods import explain, explain_many
from vitviz.models.load import load_model

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def swin(hier_dirs):
    return load_model(str(hier_dirs["swin"]), device="cpu")


def brute_force(loaded, image: Image.Image, hw, values: np.ndarray, cls: int, start="blur", seed=0, **forward_kwargs):
    """The written definition, one image at a time, in numpy; the blur is scipy's, the other starts by hand."""
    assert loaded.channel_order == (0, 1, 2)
    h, w = hw
    x = np.asarray(image.convert("RGB").resize((w, h), loaded.resample)).astype(np.float32) * loaded.rescale_factor
    gh, gw = values.shape
    n_cells = gh * gw
    order = sorted(range(n_cells), key=lambda i: (-float(values.flat[i]), i))  # largest first, ties: lower index
    n = math.ceil(n_cells / 20)
    ks = [min(i * n, n_cells) for i in range(21)]
    mean = x.reshape(-1, 3).astype(np.float64).mean(axis=0)  # per-channel mean of the input
    sigma = loaded.patch_size / 2
    if start == "blur":
        blurred = scipy.ndimage.gaussian_filter(
            x.astype(np.float64), sigma=(sigma, sigma, 0), mode="reflect", truncate=4.0
        )
    elif start == "mean":
        blurred = np.broadcast_to(mean, x.shape).astype(np.float64)
    elif start == "grey":
        blurred = np.full(x.shape, 127.5 * loaded.rescale_factor)
    else:  # noise over [0, 255 rescaled], drawn channel-first as the engine stores the input
        noise = np.random.default_rng(seed).uniform(0.0, 255.0 * loaded.rescale_factor, size=(3, h, w))
        blurred = noise.transpose(1, 2, 0)
    ys, xs = np.arange(h)[:, None], np.arange(w)[None, :]

    def cell(i):  # pixels of cell (r, c): rows [r h / gh, (r + 1) h / gh), columns likewise
        r, c = divmod(i, gw)
        return (ys >= r * h / gh) & (ys < (r + 1) * h / gh) & (xs >= c * w / gw) & (xs < (c + 1) * w / gw)

    def prob(img):
        z = (img.astype(np.float32) - np.float32(loaded.image_mean)) / np.float32(loaded.image_std)
        px = torch.from_numpy(z).permute(2, 0, 1)[None].contiguous()
        with torch.no_grad():
            logits = loaded.model(pixel_values=px, **forward_kwargs).logits
        return float(torch.softmax(logits.double(), -1)[0, cls])

    deletion, insertion = [], []
    for k in ks:
        d, ins = x.astype(np.float64).copy(), blurred.copy()
        for i in order[:k]:
            m = cell(i)
            d[m] = mean
            ins[m] = x[m]
        deletion.append(prob(d))
        insertion.append(prob(ins))
    fr = [k / n_cells for k in ks]
    area = lambda y: sum((fr[i + 1] - fr[i]) * (y[i] + y[i + 1]) / 2 for i in range(20))  # noqa: E731
    return np.array(ks), np.array(deletion), np.array(insertion), area(deletion), area(insertion)


def test_curve_steps_always_21_points_the_last_all_cells():
    s = curve_steps(196)  # ViT-B/16 at 224: n = 10, not a divisor of 196
    assert len(s) == 21 and s[1] == 10 and s[-2] == 190 and s[-1] == 196
    s = curve_steps(144)  # the demo: n = 8 reaches 144 at i = 18, the last points repeat it
    assert len(s) == 21 and s[1] == 8 and list(s[-3:]) == [144, 144, 144]
    assert list(curve_steps(7)) == [*range(8), *[7] * 13]
    assert list(curve_steps(40)) == list(range(0, 41, 2))


def test_patch_order_largest_first_ties_lower_index_first():
    np.testing.assert_array_equal(patch_order(np.array([[1.0, 2.0], [2.0, 0.0]])), [1, 2, 0, 3])
    np.testing.assert_array_equal(patch_order(np.zeros((2, 3))), range(6))
    with pytest.raises(FaithfulnessError, match="non-finite"):
        patch_order(np.array([[np.nan, 1.0]]))


def test_trapezoid_area_by_hand():
    assert trapezoid_area([0, 0.5, 1], [1, 0.5, 0]) == pytest.approx(0.5 * 1.5 / 2 + 0.5 * 0.5 / 2)
    assert trapezoid_area([0, 0.25, 1, 1, 1], [1, 0, 1, 7, 3]) == pytest.approx(0.125 + 0.375)  # repeats add nothing


def test_blur_is_scipys_reflect_gaussian_even_past_the_border():
    x = np.random.default_rng(0).random((3, 10, 7))
    for sigma in (0.5, 4.0, 8.0):  # radius 32 > both sides: the mirror repeats
        expected = scipy.ndimage.gaussian_filter(x, sigma=(0, sigma, sigma), mode="reflect", truncate=4.0)
        np.testing.assert_allclose(gaussian_blur(x, sigma), expected, atol=1e-12)


def test_peak_in_box_hand_case_and_the_demo_rule():
    v = np.zeros((3, 4))
    v[1, 2] = v[2, 3] = 5.0  # a tie: the lower index (1, 2) counts; its centre is (20, 12) on 24 x 32 px
    assert peak_in_box(v, (16, 8, 24, 16), (24, 32))
    assert not peak_in_box(v, (16, 8, 20, 16), (24, 32))  # x1 exclusive
    assert not peak_in_box(v, (24, 16, 32, 24), (24, 32))  # the other maximum's cell
    rng = np.random.default_rng(1)
    for _ in range(50):
        m = rng.random((12, 12))
        box = tuple(int(b) for b in np.sort(rng.integers(0, 97, 4).reshape(2, 2), axis=0).T.ravel()[[0, 2, 1, 3]])
        assert peak_in_box(m, box, (96, 96)) == demo_peak_in_box(m, box, 8)


def test_plain_vit_matches_brute_force_with_ties(tiny_models):
    """N = 196 cells (n = 10, not a divisor), a map with many ties, both curves and areas."""
    loaded, image = tiny_models["vit"], random_image(31, (70, 50))
    rng = np.random.default_rng(0)
    values = np.round(rng.random((14, 14)) * 3) / 3  # four levels: ties everywhere
    calls = []
    got = faithfulness(
        loaded,
        image,
        values,
        target=1,
        size=112,
        batch_size=9,
        progress=lambda d, t: calls.append((d, t)),
        insertion_start="blur",
    )
    ks, deletion, insertion, d_area, i_area = brute_force(
        loaded, image, (112, 112), values, 1, interpolate_pos_encoding=True
    )
    assert isinstance(got, Faithfulness) and got.map.grid == (14, 14)
    np.testing.assert_array_equal(got.steps, ks)
    np.testing.assert_allclose(got.fractions, ks / 196)
    np.testing.assert_allclose(got.deletion, deletion, atol=2e-6)
    np.testing.assert_allclose(got.insertion, insertion, atol=2e-6)
    assert got.deletion_area == pytest.approx(d_area, abs=2e-6)
    assert got.insertion_area == pytest.approx(i_area, abs=2e-6)
    assert got.probability == pytest.approx(deletion[0], abs=2e-6) and got.insertion[-1] == got.deletion[0]
    # 40 images besides the original, in batches of 9: progress after each batch
    assert [d for d, _ in calls] == [9, 18, 27, 36, 40] and {t for _, t in calls} == {40}
    assert got.peak_in_box is None


@pytest.mark.parametrize("start", ["mean", "grey", "noise"])
def test_every_insertion_start_matches_brute_force(tiny_models, start):
    """Insertion from the image's mean colour, a fixed grey, or seeded noise; deletion does not change."""
    loaded, image = tiny_models["vit"], random_image(35, (40, 60))
    values = np.random.default_rng(2).random((14, 14))
    got = faithfulness(loaded, image, values, target=0, size=112, insertion_start=start, seed=7)
    ks, deletion, insertion, d_area, i_area = brute_force(
        loaded, image, (112, 112), values, 0, start=start, seed=7, interpolate_pos_encoding=True
    )
    assert got.insertion_start == start
    np.testing.assert_array_equal(got.steps, ks)
    assert got.deletion_area == pytest.approx(d_area, abs=2e-6)
    np.testing.assert_allclose(got.deletion, deletion, atol=2e-6)
    np.testing.assert_allclose(got.insertion, insertion, atol=2e-6)
    assert got.insertion_area == pytest.approx(i_area, abs=2e-6)
    blur = faithfulness(loaded, image, values, target=0, size=112, insertion_start="blur")
    np.testing.assert_array_equal(blur.deletion, got.deletion)  # deletion keeps the mean fill whatever the start
    assert blur.insertion[0] != got.insertion[0] and blur.insertion[-1] == got.insertion[-1]


def test_insertion_start_image_by_hand_and_unknown_starts():
    x = np.arange(2 * 3 * 4, dtype=np.float64).reshape(2, 3, 4) / 24
    np.testing.assert_allclose(
        insertion_start_image(x, "mean", sigma=1.0), np.broadcast_to([[[5.5 / 24]], [[17.5 / 24]]], x.shape)
    )
    np.testing.assert_array_equal(
        insertion_start_image(x, "grey", sigma=1.0, full_range=255.0), np.full(x.shape, 127.5)
    )
    a = insertion_start_image(x, "noise", sigma=1.0, seed=3)
    np.testing.assert_array_equal(a, np.random.default_rng(3).uniform(0, 1, size=x.shape))
    assert not np.array_equal(a, insertion_start_image(x, "noise", sigma=1.0, seed=4))
    np.testing.assert_array_equal(insertion_start_image(x, "blur", sigma=1.0), gaussian_blur(x, 1.0))
    assert x[0, 0, 1] == 1 / 24  # not changed
    with pytest.raises(FaithfulnessError, match="blur, mean, grey, noise"):
        insertion_start_image(x, "black", sigma=1.0)


def test_swin_matches_brute_force_on_the_first_stage_grid(swin):
    loaded, image = swin, random_image(32, (64, 64))
    m = explain(loaded, image, "gradcam", target=2)  # 8 x 8 map placed on 16 x 16: ties in 2 x 2 blocks
    assert m.grid == (16, 16)
    got = faithfulness(loaded, image, m, box=(0, 0, 64, 64), insertion_start="blur")
    assert got.class_index == 2 and got.method == "gradcam" and got.peak_in_box is True
    ks, deletion, insertion, d_area, i_area = brute_force(loaded, image, (64, 64), m.values, 2)
    np.testing.assert_array_equal(got.steps, ks)  # N = 256, n = 13
    np.testing.assert_allclose(got.deletion, deletion, atol=2e-6)
    np.testing.assert_allclose(got.insertion, insertion, atol=2e-6)
    assert got.deletion_area == pytest.approx(d_area, abs=2e-6)
    assert got.insertion_area == pytest.approx(i_area, abs=2e-6)


def test_images_no_map_changes_are_forwarded_once(tiny_models):
    loaded, image = tiny_models["vit"], random_image(33)
    pert = Perturbations(loaded, image, size=112)
    assert pert.forwards == 1 and pert.grid == (14, 14)
    a = pert.curves(np.random.default_rng(0).random((14, 14)))
    assert pert.forwards == 41  # original + 20 deletion + 20 insertion images
    b = pert.curves(np.random.default_rng(1).random((14, 14)))
    assert pert.forwards == 79  # the original, the mean image and the blurred image are shared
    assert a.deletion[-1] == b.deletion[-1] and a.insertion[0] == b.insertion[0]
    with pytest.raises(FaithfulnessError, match="grid"):
        pert.curves(np.zeros((4, 4)))
    with pytest.raises(FaithfulnessError, match="without a classifier"):
        Perturbations(tiny_models["dino"], image)


def test_rollout_and_relevance_beat_random_on_the_demo(demo_model):
    """Deletion and insertion areas on five shapes images; measured numbers are in docs/evaluate.md#demo-500.

    Only the ordering of the means is asserted: rollout and relevance delete faster (lower area) and insert
    faster from the default start, the image's mean colour (higher area), than the mean of the random baseline
    over two seeds (measured: insertion 0.983 and 0.983 against 0.948).
    """
    areas = {"rollout": [], "relevance": [], "random": []}
    inserted = {"rollout": [], "relevance": [], "random": []}
    for i in range(5):
        s = make_sample(5000 + i)
        maps = explain_many(demo_model, s.image, ["rollout", "relevance"], target=s.label)
        rnd = [explain(demo_model, s.image, "random", seed=seed, target=s.label) for seed in range(2)]
        scored = Perturbations(demo_model, s.image, batch_size=40).curves_many([*maps.values(), *rnd], box=s.box)
        assert [f.method for f in scored] == ["rollout", "relevance", "random", "random"]
        areas["rollout"].append(scored[0].deletion_area)
        areas["relevance"].append(scored[1].deletion_area)
        areas["random"].append(np.mean([f.deletion_area for f in scored[2:]]))
        inserted["rollout"].append(scored[0].insertion_area)
        inserted["relevance"].append(scored[1].insertion_area)
        inserted["random"].append(np.mean([f.insertion_area for f in scored[2:]]))
    assert {f.insertion_start for f in scored} == {DEFAULT_INSERTION_START} == {"mean"}
    means = {k: float(np.mean(v)) for k, v in areas.items()}
    print("demo deletion areas (mean of 5 images):", {k: round(v, 3) for k, v in means.items()})
    assert means["rollout"] < means["random"] and means["relevance"] < means["random"]
    ins = {k: float(np.mean(v)) for k, v in inserted.items()}
    assert ins["rollout"] > ins["random"] and ins["relevance"] > ins["random"], ins


def test_evaluate_methods_scores_every_available_method(tiny_models):
    loaded, image = tiny_models["deit"], random_image(34)
    seen = []
    res = evaluate_methods(loaded, image, box=(0, 0, 16, 16), progress=lambda d, t: seen.append((d, t)))
    assert tuple(res) == ("attention", "rollout", "relevance", "gradcam", "integrated_gradients", "attnlrp", "random")
    assert len({f.class_index for f in res.values()}) == 1
    for f in res.values():
        assert f.deletion.shape == f.insertion.shape == (21,) and f.peak_in_box in (True, False)
        assert 0 <= f.deletion_area <= 1 and 0 <= f.insertion_area <= 1
    assert seen and seen[-1][0] == seen[-1][1]
