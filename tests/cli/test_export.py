import subprocess
import sys

import numpy as np
import pytest
from conftest import random_image
from PIL import Image

from vitviz.analysis.embeddings import position_similarity
from vitviz.analysis.rollout import rollout_matrix
from vitviz.analysis.stats import attention_entropy, mean_attention_distance
from vitviz.capture.forward import capture
from vitviz.export import capture_arrays, export_images
from vitviz.figures.overlay import photo_overlay

REQUIRED = {
    "attentions",
    "num_prefix_tokens",
    "grid",
    "rollout",
    "mean_attention_distance",
    "attention_entropy",
    "logits",
}


@pytest.fixture()
def image_files(tmp_path):
    paths = []
    for i, (w, h) in enumerate([(40, 30), (32, 32), (64, 20)]):
        p = tmp_path / f"img{i}.png"
        random_image(i, size=(w, h)).save(p)
        paths.append(p)
    return paths


def test_arrays_match_the_analysis_functions(tiny_models):
    """Stored as float16, but every reported number equals the float32 definition: storage never changes it."""
    cap = capture(tiny_models["deit"], random_image(0))
    arrays = capture_arrays(cap)
    assert REQUIRED | {"position_similarity"} <= set(arrays)
    assert cap.attention_precision == "float16"
    attn = capture(tiny_models["deit"], random_image(0), attention_dtype="float32").attentions
    assert arrays["attentions"].dtype == np.float32 and arrays["attentions"].shape == (2, 4, 18, 18)
    assert int(arrays["num_prefix_tokens"]) == 2
    np.testing.assert_allclose(
        arrays["rollout"], rollout_matrix(attn, num_prefix_tokens=2)[0, 2:].reshape(4, 4), atol=1e-6
    )
    np.testing.assert_allclose(
        arrays["mean_attention_distance"],
        mean_attention_distance(attn, num_prefix_tokens=2, grid=(4, 4), patch_size=8),
        rtol=1e-5,
    )
    np.testing.assert_allclose(arrays["attention_entropy"], attention_entropy(attn), rtol=1e-5)
    # one query map per block: the CLS row over the 4 x 4 grid, every head
    assert arrays["block_stage"].tolist() == [0, 0]
    np.testing.assert_array_equal(arrays["query_grids"], [[4, 4], [4, 4]])
    np.testing.assert_array_equal(arrays["key_grids"], [[4, 4], [4, 4]])
    np.testing.assert_allclose(arrays["query_map_001"], attn[1, :, 0, 2:].reshape(4, 4, 4), atol=1e-3)
    np.testing.assert_allclose(arrays["position_similarity"], position_similarity(cap.position_embeddings))
    assert arrays["position_similarity"].shape == (16, 16)


def test_export_writes_npz_and_png_per_image(tiny_models, image_files, tmp_path):
    out = tmp_path / "out"
    report = export_images(tiny_models["vit"], image_files, out, batch_size=2)
    assert not report.failed and len(report.written) == 3
    for p in image_files:
        with np.load(out / f"{p.stem}.npz", allow_pickle=False) as z:
            assert set(z.files) >= REQUIRED
            assert z["logits"].shape == (3,)
            assert z["rollout"].shape == tuple(z["grid"])
        png = Image.open(out / f"{p.stem}_rollout.png")
        assert png.size == Image.open(p).size  # the photo's own size, not the model input's 32 x 32
        with np.load(out / f"{p.stem}.npz", allow_pickle=False) as z:
            expected = photo_overlay(np.asarray(Image.open(p).convert("RGB")), z["rollout"], opacity=0.6)
        np.testing.assert_array_equal(np.asarray(png.convert("RGB")), expected)


def test_export_overlay_is_at_most_2048_px_on_the_long_side(tiny_models, tmp_path):
    big = tmp_path / "big.png"
    random_image(7, size=(3000, 1000)).save(big)
    export_images(tiny_models["vit"], [big], tmp_path / "out")
    assert Image.open(tmp_path / "out" / "big_rollout.png").size == (2048, 683)  # 1000 * 2048 / 3000 = 682.7


def test_batched_equals_one_at_a_time(tiny_models, image_files, tmp_path):
    export_images(tiny_models["vit"], image_files, tmp_path / "a", batch_size=3)
    export_images(tiny_models["vit"], image_files, tmp_path / "b", batch_size=1)
    for p in image_files:
        with np.load(tmp_path / "a" / f"{p.stem}.npz") as a, np.load(tmp_path / "b" / f"{p.stem}.npz") as b:
            np.testing.assert_allclose(a["attentions"], b["attentions"], atol=2e-3)


def test_backbone_without_absolute_positions(tiny_models, image_files, tmp_path):
    export_images(tiny_models["beit"], image_files[:1], tmp_path)
    with np.load(tmp_path / f"{image_files[0].stem}.npz") as z:
        assert "position_similarity" not in z.files


def _run_cli(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "vitviz", *args], capture_output=True, text=True, timeout=300, cwd=cwd)


def test_cli_keeps_good_outputs_and_fails_on_bad_input(tiny_dirs, image_files, tmp_path):
    bad = tmp_path / "broken.jpg"
    bad.write_bytes(b"this is not a jpeg")
    out = tmp_path / "cli"
    res = _run_cli(
        "export",
        "--model",
        str(tiny_dirs["dinov2"]),
        "--out",
        str(out),
        "--batch-size",
        "2",
        str(image_files[0]),
        str(bad),
        str(tmp_path / "missing.png"),
        str(image_files[1]),
    )
    assert res.returncode == 1
    assert "broken.jpg" in res.stderr and "not an image" in res.stderr
    assert "missing.png" in res.stderr
    assert "Traceback" not in res.stderr
    assert (out / "img0.npz").is_file() and (out / "img1.npz").is_file()
    assert (out / "img1_rollout.png").is_file()
    assert "export" in res.stderr  # the progress bar


def test_cli_unknown_model_is_a_clear_error(tmp_path, image_files):
    res = _run_cli("export", "--model", "not a model!", "--out", str(tmp_path), str(image_files[0]))
    assert res.returncode == 1
    assert "neither an existing local folder nor a Hugging Face model id" in res.stderr
    assert "Traceback" not in res.stderr


def test_cli_demo_data(tmp_path):
    res = _run_cli("demo-data", "--n", "4", "--seed", "3", "--out", str(tmp_path))
    assert res.returncode == 0, res.stderr
    rows = (tmp_path / "labels.csv").read_text().splitlines()
    assert rows[0] == "file,label,x0,y0,x1,y1" and len(rows) == 5
    name, label, *box = rows[1].split(",")
    assert Image.open(tmp_path / name).size == (96, 96) and label in name
    x0, y0, x1, y1 = map(int, box)
    assert 0 <= x0 < x1 <= 96 and 0 <= y0 < y1 <= 96


def test_hierarchical_export_writes_query_maps_and_no_dense_stack(hier_dirs, tmp_path):
    from vitviz.analysis.blocks import row_map, select
    from vitviz.models.load import load_model

    loaded = load_model(str(hier_dirs["swin"]))
    cap = capture(loaded, random_image(3))
    arrays = capture_arrays(cap, query_xy=(21.0, 13.0))
    assert "attentions" not in arrays
    assert arrays["block_stage"].tolist() == [0, 0, 1, 1]
    np.testing.assert_array_equal(arrays["query_grids"], [[16, 16], [16, 16], [8, 8], [8, 8]])
    np.testing.assert_array_equal(arrays["key_grids"], arrays["query_grids"])
    assert arrays["rollout"].shape == (16, 16)
    assert arrays["mean_attention_distance"].shape == (4, 4)
    assert np.isnan(arrays["mean_attention_distance"][0, 2:]).all()
    # pixel (21, 13): stage 1 cell (3, 5) of 4 px cells, stage 2 cell (1, 2) of 8 px cells
    for b, token in [(0, 3 * 16 + 5), (3, 1 * 8 + 2)]:
        block = cap.blocks[b]
        for h in range(block.num_heads):
            ref = row_map(block.geometry, select(block, head=h), token).values
            np.testing.assert_array_equal(arrays[f"query_map_{b:03d}"][h], ref)
    # without --query-xy and without CLS: the token at the input's centre (32, 32) -> cell (8, 8) on stage 1
    centre = capture_arrays(cap)
    ref = row_map(cap.blocks[0].geometry, select(cap.blocks[0], head=0), 8 * 16 + 8).values
    np.testing.assert_array_equal(centre["query_map_000"][0], ref)


def test_cli_query_xy_on_a_cvt(hier_dirs, image_files, tmp_path):
    out = tmp_path / "cvt"
    res = _run_cli(
        "export", "--model", str(hier_dirs["cvt"]), "--out", str(out), "--query-xy", "10,50", str(image_files[0])
    )
    assert res.returncode == 0, res.stderr
    with np.load(out / "img0.npz", allow_pickle=False) as z:
        stages = z["block_stage"].tolist()
        assert stages == [0, 1, 1, 2, 2, 2]
        # the last stage has CLS in queries and keys; its maps are on the reduced key grid
        assert tuple(z["key_grids"][-1]) != tuple(z["query_grids"][-1])
        assert z["query_map_005"].shape == (3, *z["key_grids"][-1])
        assert z["rollout"].shape == (16, 16)
    bad = _run_cli(
        "export", "--model", str(hier_dirs["cvt"]), "--out", str(out), "--query-xy", "ten", str(image_files[0])
    )
    assert bad.returncode == 2 and "X,Y" in bad.stderr


def test_labels_give_the_models_own_logits_per_image(modern_dirs, image_files, tmp_path):
    import torch

    from vitviz.capture.forward import input_size_for, preprocess
    from vitviz.models.load import load_model

    out = tmp_path / "zs"
    res = _run_cli(
        "export",
        "--model",
        str(modern_dirs["clip"]),
        "--out",
        str(out),
        "--labels",
        "cat, dog,car",
        str(image_files[0]),
    )
    assert res.returncode == 0, res.stderr
    loaded = load_model(str(modern_dirs["clip"]))
    img = Image.open(image_files[0]).convert("RGB")
    pixels, _ = preprocess(loaded, [img], input_size_for(loaded, None, img.size))
    tok = loaded.text.tokenizer(
        ["a photo of a cat.", "a photo of a dog.", "a photo of a car."], padding=True, return_tensors="pt"
    )
    with torch.no_grad():
        own = (
            loaded.model(
                input_ids=tok["input_ids"],
                attention_mask=tok["attention_mask"],
                pixel_values=pixels,
                interpolate_pos_encoding=True,
            )
            .logits_per_image[0]
            .numpy()
        )
    with np.load(out / "img0.npz", allow_pickle=False) as z:
        assert z["label_names"].tolist() == ["cat", "dog", "car"]
        np.testing.assert_allclose(z["logits"], own, rtol=1e-4, atol=1e-4)
        assert z["label_probabilities"].sum() == pytest.approx(1.0, abs=1e-5)  # CLIP: softmax over the labels
        tokens, rel = z["label_tokens"], z["label_token_relevance"]
        assert tokens.dtype.kind == "U" and tokens.shape == rel.shape and tokens.shape[0] == 3
        assert tokens[0].tolist() == ["<bos>", "a", "photo", "of", "a", "cat", ".", "<eos>"]
        assert np.isfinite(rel).all() and (rel >= 0).all()  # three prompts of one length: no padding
    from vitviz.capture.forward import capture
    from vitviz.models.prompt_relevance import prompt_relevance
    from vitviz.models.zeroshot import parse_labels

    cap = capture(loaded, img)
    words = prompt_relevance(loaded.model, loaded.text, cap.image_embedding, parse_labels("cat, dog,car"))
    with np.load(out / "img0.npz", allow_pickle=False) as z:
        np.testing.assert_allclose(z["label_token_relevance"], np.stack([w.relevance for w in words]), rtol=1e-5)
    bad = _run_cli(
        "export",
        "--model",
        str(modern_dirs["clip"]),
        "--out",
        str(tmp_path / "bad"),
        "--labels",
        "cat",
        "--relevance-from-block",
        "1",
        str(image_files[0]),
    )
    assert bad.returncode == 1 and "0..0" in bad.stderr and "Traceback" not in bad.stderr  # a 1-block text tower
    as_is = _run_cli(
        "export",
        "--model",
        str(modern_dirs["clip"]),
        "--out",
        str(tmp_path / "raw"),
        "--labels",
        "cat",
        "--template",
        "{}",
        str(image_files[0]),
    )
    assert as_is.returncode == 0, as_is.stderr
    plain = _run_cli("export", "--model", str(modern_dirs["clip"]), "--out", str(tmp_path / "bb"), str(image_files[0]))
    assert plain.returncode == 0, plain.stderr
    with np.load(tmp_path / "bb" / "img0.npz", allow_pickle=False) as z:  # without --labels: a backbone
        assert "label_names" not in z.files and z["logits"].shape == (0,)


def test_labels_the_tokenizer_does_not_know_are_a_warning(image_files, tmp_path):
    res = _run_cli(
        "export", "--model", "demo-clip", "--out", str(tmp_path), "--labels", "cat,dog,circle", str(image_files[0])
    )
    assert res.returncode == 0, res.stderr
    warned = [ln for ln in res.stderr.splitlines() if ln.startswith("warning:")]
    assert len(warned) == 1 and "does not know 'cat', 'dog'" in warned[0] and "'circle'" not in warned[0]
    known = _run_cli(
        "export", "--model", "demo-clip", "--out", str(tmp_path), "--labels", "circle,star", str(image_files[0])
    )
    assert known.returncode == 0 and "warning:" not in known.stderr


def test_labels_on_a_model_without_a_text_tower_are_refused(tiny_dirs, image_files, tmp_path):
    res = _run_cli(
        "export", "--model", str(tiny_dirs["vit"]), "--out", str(tmp_path), "--labels", "cat", str(image_files[0])
    )
    assert res.returncode == 1 and "has no text tower" in res.stderr and "Traceback" not in res.stderr
    assert not list(tmp_path.glob("*.npz"))  # refused before any image was read
    empty = _run_cli(
        "export", "--model", str(tiny_dirs["vit"]), "--out", str(tmp_path), "--labels", " , ", str(image_files[0])
    )
    assert empty.returncode == 1 and "at least one label" in empty.stderr


def test_causal_export_on_the_demo_model(tmp_path):
    from vitviz.causal import direct_logit_attribution, knock_out
    from vitviz.data.images import load_image
    from vitviz.data.shapes import make_sample
    from vitviz.models.load import load_model

    path = tmp_path / "cross.png"
    make_sample(220).image.save(path)
    out = tmp_path / "causal"
    res = _run_cli("export", "--model", "demo", "--out", str(out), "--causal", "--class", "3", str(path))
    assert res.returncode == 0, res.stderr
    demo = load_model("demo")
    with np.load(out / "cross.npz", allow_pickle=False) as z:
        assert int(z["explained_class"]) == 3
        assert z["logit_lens"].shape == (5, 5) and z["head_ablation"].shape == (4, 4)
        img = load_image(path)
        ko = knock_out(demo, img, [(0, 3)], mode="zero")
        assert z["head_ablation"][0, 3] == pytest.approx(ko.effect[3], rel=1e-4, abs=1e-5)
        att = direct_logit_attribution(demo, img, target=3)
        np.testing.assert_allclose(z["head_attribution"], att.heads, rtol=1e-5)
        total = z["head_attribution"].sum() + z["mlp_attribution"].sum() + float(z["attribution_rest"])
        assert total == pytest.approx(float(z["logit_lens"][-1, 3]), rel=1e-4)


def test_causal_export_says_what_a_hierarchical_model_lacks(hier_dirs, image_files, tmp_path):
    res = _run_cli("export", "--model", str(hier_dirs["cvt"]), "--out", str(tmp_path), "--causal", str(image_files[0]))
    assert res.returncode == 0, res.stderr
    assert "note: head_attribution left out" in res.stderr
    with np.load(tmp_path / "img0.npz", allow_pickle=False) as z:
        assert "head_ablation" in z.files and "head_attribution" not in z.files


def test_export_gif_steps_through_the_blocks(tiny_models, tiny_dirs, image_files, tmp_path):
    from vitviz.__main__ import main
    from vitviz.figures.animation import BAND, gif_frames, view_stack

    p = image_files[0]  # 40 x 30
    export_images(tiny_models["vit"], [p], tmp_path / "a", gif="rollout")
    gif = Image.open(tmp_path / "a" / f"{p.stem}_rollout.gif")
    cap = capture(tiny_models["vit"], Image.open(p))
    maps, labels = view_stack(cap, "rollout")
    assert gif.n_frames == len(maps) == cap.num_blocks and gif.size == (40, 30 + BAND)
    want = gif_frames(Image.open(p), maps, labels)
    for i in range(gif.n_frames):
        gif.seek(i)
        assert np.abs(np.asarray(gif.convert("RGB"), float) - want[i]).mean() < 6  # 256 colours per frame
    argv = ["export", "--model", str(tiny_dirs["vit"]), "--out", str(tmp_path / "b"), "--gif", "head"]
    assert main([*argv, "--gif-head", "1", str(p)]) == 0
    assert Image.open(tmp_path / "b" / f"{p.stem}_head.gif").n_frames == cap.num_blocks


def test_export_methods_write_the_maps_explain_gives(tiny_models, image_files, tmp_path):
    from PIL import Image as PILImage

    from vitviz.methods import MethodError, explain

    loaded = tiny_models["vit"]
    from vitviz.capture.targets import Target

    export_images(loaded, image_files[:2], tmp_path / "m", methods=["attnlrp", "rollout"], target=Target.of_class(2))
    for p in image_files[:2]:
        with np.load(tmp_path / "m" / f"{p.stem}.npz") as z:
            assert int(z["method_class"]) == 2
            for name in ("attnlrp", "rollout"):
                ref = explain(loaded, PILImage.open(p).convert("RGB"), name, target=2).values
                np.testing.assert_allclose(z[f"method_{name}"], ref, rtol=1e-5, atol=1e-7)
    with pytest.raises(MethodError, match="backbone without a classifier"):
        export_images(tiny_models["dino"], image_files[:1], tmp_path / "d", methods=["attnlrp"])
    assert not (tmp_path / "d" / "img0.npz").exists()  # refused before any image


def test_cli_export_unknown_method_is_a_clear_error(tmp_path, image_files):
    res = _run_cli("export", "--methods", "attnlrp,nope", "--out", str(tmp_path), str(image_files[0]))
    assert res.returncode == 1 and "unknown explanation method 'nope'" in res.stderr
    assert "Traceback" not in res.stderr
