import subprocess
import sys

import numpy as np
import pytest
from conftest import random_image
from PIL import Image

from vitviz.analysis.embeddings import position_similarity
from vitviz.analysis.rollout import rollout_matrix
from vitviz.analysis.stats import attention_entropy, mean_attention_distance
from vitviz.capture.run import capture
from vitviz.export import capture_arrays, export_images

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
    cap = capture(tiny_models["deit"], random_image(0))
    arrays = capture_arrays(cap)
    assert REQUIRED | {"position_similarity"} <= set(arrays)
    attn = cap.attentions.astype(np.float32)
    assert arrays["attentions"].dtype == np.float32 and arrays["attentions"].shape == (2, 4, 18, 18)
    assert int(arrays["num_prefix_tokens"]) == 2
    np.testing.assert_allclose(
        arrays["rollout"], rollout_matrix(attn, num_prefix_tokens=2)[0, 2:].reshape(4, 4), atol=1e-6
    )
    np.testing.assert_allclose(
        arrays["mean_attention_distance"], mean_attention_distance(attn, num_prefix_tokens=2, grid=(4, 4), patch_size=8)
    )
    np.testing.assert_allclose(arrays["attention_entropy"], attention_entropy(attn))
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
        assert Image.open(out / f"{p.stem}_rollout.png").size == (32, 32)


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
    res = _run_cli("export", "--model", str(tiny_dirs["dinov2"]), "--out", str(out), "--batch-size", "2",
                   str(image_files[0]), str(bad), str(tmp_path / "missing.png"), str(image_files[1]))  # fmt: skip
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
