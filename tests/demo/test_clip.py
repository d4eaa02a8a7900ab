"""The bundled zero-shot demo ``demo-clip``: small, safetensors, offline, and its typed labels work."""

import json

import pytest

from vitviz.__main__ import main
from vitviz.data import shapes as demo_data
from vitviz.demo.clip import CLIP_DEMO_DIR, LABELS, TEMPLATE, score_clip_folder
from vitviz.models.load import load_model

# Seeds far from the training images (0..20 000), from train_clip_demo's held-out set
# (1 000 003..) and from the ViT demo's test set (5 000 000..).
HELD_OUT = range(7_000_000, 7_000_100)


def test_files_are_small_safe_and_declare_the_template():
    files = {p.name for p in CLIP_DEMO_DIR.iterdir()}
    assert {"config.json", "model.safetensors", "preprocessor_config.json", "tokenizer.json", "vitviz.json"} <= files
    assert not any(f.endswith((".bin", ".pt", ".pth", ".pkl")) for f in files)
    assert sum(p.stat().st_size for p in CLIP_DEMO_DIR.iterdir()) <= 8 * 1024 * 1024
    settings = json.loads((CLIP_DEMO_DIR / "vitviz.json").read_text())
    assert settings == {"prompt_template": TEMPLATE, "labels": "circle, square, triangle, cross, star"}
    assert json.loads((CLIP_DEMO_DIR / "training.json").read_text())["held_out"]["accuracy"] >= 0.9


def test_loads_by_name_as_a_zero_shot_model():
    loaded = load_model("demo-clip", device="cpu")
    assert loaded.zero_shot and not loaded.has_classifier
    assert loaded.text.template == TEMPLATE and loaded.text.labels == LABELS
    assert loaded.patch_size == 8 and loaded.default_size == (96, 96)
    ids = loaded.text.tokenizer("a photo of a star.")["input_ids"]
    assert loaded.text.tokenizer.unk_token_id not in ids and ids[-1] == loaded.config.text_config.eos_token_id


def test_zero_shot_accuracy_and_relevance_peak_in_box_on_fresh_held_out_set():
    images, labels, boxes = demo_data.make_batch(HELD_OUT)
    s = score_clip_folder("demo-clip", images, labels, boxes)
    print(
        f"demo-clip on {s.n} fresh images: zero-shot accuracy {s.accuracy:.3f}, relevance peak in box {s.peak_in_box:.3f}"
    )
    assert s.n == len(HELD_OUT)
    assert s.accuracy >= 0.95
    assert s.peak_in_box >= 0.70


@pytest.mark.filterwarnings("ignore")
def test_train_demo_arch_clip_writes_a_loadable_zero_shot_model(tmp_path):
    argv = ["train-demo", "--arch", "clip", "--out", str(tmp_path), "--steps", "2", "--batch-size", "8"]
    assert main([*argv, "--train-images", "32", "--held-out", "10"]) == 1  # two steps miss the goals
    score = json.loads((tmp_path / "training.json").read_text())["held_out"]
    assert 0.0 <= score["accuracy"] <= 1.0 and 0.0 <= score["peak_in_box"] <= 1.0 and score["n"] == 10
    loaded = load_model(str(tmp_path), device="cpu")
    assert loaded.zero_shot and loaded.text.template == TEMPLATE
    assert json.loads((tmp_path / "training.json").read_text())["steps"] == 2


def test_a_caption_without_a_positive_adds_no_nan():
    """A batch column no image matches: left out of the text-side mean (it made every weight NaN after a step)."""
    import torch

    from vitviz.demo.clip import _multi_positive_loss

    logits = torch.tensor([[2.0, 0.5, 1.0], [0.1, 1.5, -1.0]], requires_grad=True)
    positive = torch.tensor([[True, False, False], [False, True, False]])  # column 2: no positive
    loss = _multi_positive_loss(logits, positive)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(logits.grad).all()
    ls1, ls0 = torch.log_softmax(logits.detach(), 1), torch.log_softmax(logits.detach(), 0)
    by_hand = 0.5 * (-(ls1[0, 0] + ls1[1, 1]) / 2 - (ls0[0, 0] + ls0[1, 1]) / 2)
    assert torch.isclose(loss.detach(), by_hand)
