"""The bundled demo model: small, safetensors, and good enough that its attention means something."""

import json

import numpy as np
from PIL import Image

from vitviz.analysis.rollout import rollout
from vitviz.capture.forward import capture_batch
from vitviz.data import shapes as demo_data
from vitviz.demo.vit import DEMO_DIR, peak_in_box, train_demo
from vitviz.models.load import load_model

# Seeds far from the training images (0..40 000) and from train-demo's own held-out set.
HELD_OUT = range(5_000_000, 5_000_400)


def test_files_are_small_safe_and_labelled():
    files = {p.name for p in DEMO_DIR.iterdir()}
    assert {"config.json", "model.safetensors", "preprocessor_config.json"} <= files
    assert not any(f.endswith((".bin", ".pt", ".pth", ".pkl")) for f in files)
    assert sum(p.stat().st_size for p in DEMO_DIR.iterdir()) <= 10 * 1024 * 1024
    cfg = json.loads((DEMO_DIR / "config.json").read_text())
    assert list(cfg["id2label"].values()) == list(demo_data.CLASSES)


def test_accuracy_and_rollout_peak_in_box_on_fresh_held_out_set(demo_model):
    images, labels, boxes = demo_data.make_batch(HELD_OUT)
    caps = []
    for i in range(0, len(images), 100):
        caps += capture_batch(demo_model, [Image.fromarray(a) for a in images[i : i + 100]])
    predicted = np.array([c.predictions[0].index for c in caps])
    accuracy = float((predicted == labels).mean())
    hits = [
        peak_in_box(rollout(c.attentions, num_prefix_tokens=1)[1:].reshape(c.grid), tuple(b), c.patch_size)
        for c, b in zip(caps, boxes, strict=True)
    ]
    in_box = float(np.mean(hits))
    print(f"demo model on {len(caps)} fresh images: accuracy {accuracy:.3f}, rollout peak in box {in_box:.3f}")
    assert accuracy >= 0.95
    assert in_box >= 0.90


def test_peak_in_box_rule():
    grid = np.zeros((4, 4))
    grid[1, 2] = 1.0  # centre of that 8 px patch: (20, 12)
    assert peak_in_box(grid, (16, 8, 24, 16), 8)
    assert not peak_in_box(grid, (0, 0, 20, 12), 8)  # x1 / y1 are exclusive


def test_train_demo_writes_a_loadable_checkpoint(tmp_path):
    score = train_demo(tmp_path, steps=2, train_images=64, log=lambda *_: None)
    assert 0.0 <= score.accuracy <= 1.0 and score.n == 500
    loaded = load_model(str(tmp_path))
    assert loaded.patch_size == 8 and loaded.id2label[4] == "star"
    assert json.loads((tmp_path / "training.json").read_text())["steps"] == 2
    recipe = json.loads((tmp_path / "training.json").read_text())
    assert (recipe["label_smoothing"], recipe["lr"]) == (0.0, 3e-4)  # the bundled demo's recipe is the default


def test_the_bundled_demo_records_the_default_recipe():
    """The shipped model was trained by ``train-demo``'s defaults (no label smoothing, lr 3e-4, seed 0)."""
    recipe = json.loads((DEMO_DIR / "training.json").read_text())
    assert (recipe["seed"], recipe["steps"], recipe["lr"], recipe["label_smoothing"]) == (0, 2000, 3e-4, 0.0)
    assert recipe["held_out"]["accuracy"] >= 0.95 and recipe["held_out"]["peak_in_box"] >= 0.90


def test_train_demo_label_smoothing_and_lr_are_choices_recorded_and_checked(tmp_path, capsys):
    from vitviz.__main__ import main

    argv = ["train-demo", "--out", str(tmp_path), "--steps", "2", "--batch-size", "8", "--train-images", "32"]
    assert main([*argv, "--held-out", "20", "--label-smoothing", "0.1", "--lr", "1e-3"]) in (0, 1)  # 1: goals unmet
    recipe = json.loads((tmp_path / "training.json").read_text())
    assert (recipe["label_smoothing"], recipe["lr"]) == (0.1, 1e-3)
    for bad in (["--label-smoothing", "1.5"], ["--arch", "clip", "--label-smoothing", "0"]):
        assert main([*argv, *bad]) == 2
        assert "--label-smoothing" in capsys.readouterr().err
    for bad in ("0", "-1e-3", "nan", "inf"):
        assert main([*argv, f"--lr={bad}"]) == 2  # "=": argparse reads a lone "-1e-3" as an option
        assert "--lr must be a positive number" in capsys.readouterr().err
