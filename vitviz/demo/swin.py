"""Train and evaluate the bundled ``demo-swin`` model on the synthetic shapes of ``vitviz.data.shapes``.

The model is a small Hugging Face ``SwinForImageClassification`` (96 px input,
4 px patches, 6 x 6 windows, three stages of 24 x 24, 12 x 12 and 6 x 6 tokens:
16 shifted windows in the first stage, one window in the last), saved with
``save_pretrained`` as safetensors so it loads like any hub checkpoint. Swin has
no CLS token: its readout is the mean of the final tokens, so the map the app
shows is the pooled-query rollout through the stages (``docs/definitions.md#rollout-through-stages``), and the
held-out score is computed through vitviz's own capture and ``capture_rollout``.
Training is reproducible from its seed.
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

import torch

from vitviz.data import shapes as demo_data
from vitviz.demo.score import score_capture_rollout
from vitviz.demo.vit import DemoScore, _augment, _to_pixels, save_processor, training_data, warmup_cosine

__all__ = ["SWIN_DEMO_DIR", "swin_demo_config", "train_swin_demo", "score_swin_folder"]

SWIN_DEMO_DIR = Path(__file__).resolve().parents[1] / "assets" / "demo-swin"
PATCH = 4
WINDOW = 6


def swin_demo_config():
    """The demo Swin's architecture: embed dim 32, depths [2, 2, 2], heads [2, 4, 8], window 6."""
    from transformers import SwinConfig

    return SwinConfig(
        image_size=demo_data.IMAGE_SIZE,
        patch_size=PATCH,
        num_channels=3,
        embed_dim=32,
        depths=[2, 2, 2],
        num_heads=[2, 4, 8],
        window_size=WINDOW,
        mlp_ratio=4.0,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        drop_path_rate=0.0,
        num_labels=len(demo_data.CLASSES),
        id2label=dict(enumerate(demo_data.CLASSES)),
        label2id={c: i for i, c in enumerate(demo_data.CLASSES)},
    )


def _save(model, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    impl = model.config._attn_implementation
    model.config.attn_implementation = None  # let the loader choose; vitviz asks for eager
    model.save_pretrained(out, safe_serialization=True)
    model.set_attn_implementation(impl)
    save_processor(out)


def score_swin_folder(folder: str | Path, images, labels, boxes) -> DemoScore:
    """Load a saved model through vitviz and score it with vitviz's capture + pooled-query rollout."""
    from vitviz.models.load import load_model

    return score_capture_rollout(load_model(str(folder), device="cpu"), images, labels, boxes)


def _score_model(model, held) -> DemoScore:
    with tempfile.TemporaryDirectory() as tmp:
        _save(model, Path(tmp))
        return score_swin_folder(tmp, *held)


def train_swin_demo(
    out: str | Path,
    *,
    seed: int = 0,
    steps: int = 2000,
    batch_size: int = 64,
    train_images: int = 40_000,
    lr: float = 1e-3,
    weight_decay: float = 0.05,
    held_out: int = 500,
    eval_every: int = 250,
    token_loss: float = 0.0,
    config=None,
    log=print,
) -> DemoScore:
    """Train the demo Swin from scratch and save it (HF format) under ``out``.

    Returns its score on ``held_out`` held-out images (data seed ``seed + 1``, never
    trained on), measured through vitviz's capture and the pooled-query rollout.
    """
    from transformers import SwinForImageClassification

    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    t0 = time.time()
    (images, labels, _), held = training_data(seed, train_images, held_out, log)

    model = SwinForImageClassification(config or swin_demo_config())
    model.set_attn_implementation("sdpa")  # fast for training; vitviz captures with eager
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    sched = warmup_cosine(opt, steps)
    y_all = torch.from_numpy(labels)
    for step in range(steps):
        model.train()
        idx = torch.randint(len(images), (batch_size,), generator=gen)
        x = _augment(_to_pixels(images[idx.numpy()]), gen)
        y = y_all[idx]
        tokens = model.swin(pixel_values=x).last_hidden_state  # (B, 36, C) after the final norm
        logits = model.classifier(tokens.mean(dim=1))  # what the model's own forward computes
        loss = torch.nn.functional.cross_entropy(logits, y, label_smoothing=0.1)
        if token_loss:
            per_token = model.classifier(tokens).flatten(0, 1)
            loss = loss + token_loss * torch.nn.functional.cross_entropy(
                per_token, y.repeat_interleave(tokens.shape[1]), label_smoothing=0.1
            )
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if (step + 1) % eval_every == 0 and step + 1 < steps:
            model.eval()
            score = _score_model(model, tuple(a[:200] for a in held))
            log(
                f"step {step + 1}/{steps} loss {loss.item():.3f} held-out acc {score.accuracy:.3f} "
                f"peak-in-box {score.peak_in_box:.3f} ({time.time() - t0:.0f} s)"
            )

    model.eval()
    seconds = round(time.time() - t0)
    out = Path(out)
    _save(model, out)
    score = score_swin_folder(out, *held)
    (out / "training.json").write_text(
        json.dumps(
            {
                "seed": seed,
                "steps": steps,
                "batch_size": batch_size,
                "train_images": train_images,
                "lr": lr,
                "weight_decay": weight_decay,
                "token_loss": token_loss,
                "seconds": seconds,
                "held_out": score.__dict__,
            },
            indent=2,
        )
    )
    log(f"saved to {out}: held-out accuracy {score.accuracy:.3f}, peak-in-box {score.peak_in_box:.3f}")
    return score
