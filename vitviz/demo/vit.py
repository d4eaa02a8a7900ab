"""Train and evaluate the bundled ``demo`` ViT on the synthetic shapes of ``demo_data``.

The model is a small Hugging Face ``ViTForImageClassification`` (96 px input,
8 px patches, 12 x 12 grid), saved with ``save_pretrained`` as safetensors so it
loads like any hub checkpoint. Training is reproducible from its seed.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from vitviz.analysis.rollout import rollout
from vitviz.data import shapes as demo_data

__all__ = ["DEMO_DIR", "DemoScore", "demo_config", "train_demo", "peak_in_box", "score_demo"]

DEMO_DIR = Path(__file__).resolve().parents[1] / "assets" / "demo-vit"
PATCH = 8
MEAN = STD = (0.5, 0.5, 0.5)


def demo_config():
    """The demo model's architecture: 4 layers, 4 heads, width 96 (about 0.33 M parameters)."""
    from transformers import ViTConfig

    return ViTConfig(
        image_size=demo_data.IMAGE_SIZE,
        patch_size=PATCH,
        hidden_size=96,
        num_hidden_layers=4,
        num_attention_heads=4,
        intermediate_size=192,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        num_labels=len(demo_data.CLASSES),
        id2label=dict(enumerate(demo_data.CLASSES)),
        label2id={c: i for i, c in enumerate(demo_data.CLASSES)},
    )


def _to_pixels(images: np.ndarray) -> torch.Tensor:
    """uint8 ``(B, S, S, 3)`` -> normalised float ``(B, 3, S, S)``, as the image processor does."""
    x = torch.from_numpy(images).permute(0, 3, 1, 2).float().div_(255.0)
    return (x - 0.5) / 0.5


def _augment(x: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """Random dihedral transform per batch: every class is invariant to flips and 90-degree turns."""
    k = int(torch.randint(4, (1,), generator=gen))
    x = torch.rot90(x, k, dims=(2, 3))
    if torch.rand(1, generator=gen).item() < 0.5:
        x = torch.flip(x, dims=(3,))
    return x


def training_data(seed: int, train_images: int, held_out: int, log=print):
    """The training set ``(images, labels, boxes)`` (sample ids ``seed * 1_000_003 ...``) and the held-out set
    (ids from ``(seed + 1) * 1_000_003``: never trained on), as ``demo_data.make_batch`` gives them."""
    t0 = time.time()
    train = demo_data.make_batch(range(seed * 1_000_003, seed * 1_000_003 + train_images))
    held = demo_data.make_batch(range((seed + 1) * 1_000_003, (seed + 1) * 1_000_003 + held_out))
    log(f"generated {train_images} training images in {time.time() - t0:.0f} s")
    return train, held


def warmup_cosine(opt: torch.optim.Optimizer, steps: int) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warm-up over the first 5 % of ``steps``, then a cosine decay to zero: every demo trainer's schedule."""
    warmup = max(1, steps // 20)
    return torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(1.0, s / steps)))
    )


def save_processor(out: Path) -> None:
    """The demos' image processor: resize to the shapes' size (bilinear), normalise with ``MEAN`` / ``STD``."""
    from transformers import ViTImageProcessor

    ViTImageProcessor(
        size={"height": demo_data.IMAGE_SIZE, "width": demo_data.IMAGE_SIZE},
        image_mean=list(MEAN),
        image_std=list(STD),
        resample=2,  # bilinear
    ).save_pretrained(out)


@dataclass(frozen=True)
class DemoScore:
    accuracy: float  # top-1 on the held-out set
    peak_in_box: float  # share of images whose CLS-rollout peak lies in the shape's box
    n: int


def peak_in_box(rollout_grid: np.ndarray, box: tuple[int, int, int, int], patch: int) -> bool:
    """Does the centre of the highest patch of ``rollout_grid`` ``(gh, gw)`` lie inside ``box``?

    ``box`` is ``(x0, y0, x1, y1)`` in pixels of the model input, ``x1``/``y1`` exclusive.
    """
    row, col = np.unravel_index(int(np.argmax(rollout_grid)), rollout_grid.shape)
    cx, cy = (col + 0.5) * patch, (row + 0.5) * patch
    x0, y0, x1, y1 = box
    return bool(x0 <= cx < x1 and y0 <= cy < y1)


@torch.no_grad()
def score_demo(model, images: np.ndarray, labels: np.ndarray, boxes: np.ndarray, *, batch: int = 100) -> DemoScore:
    """Accuracy and rollout-peak-in-box rate of ``model`` (eager attention) on a labelled set."""
    model.eval()
    grid = (images.shape[1] // PATCH, images.shape[2] // PATCH)
    correct = hits = 0
    for i in range(0, len(images), batch):
        out = model(pixel_values=_to_pixels(images[i : i + batch]), output_attentions=True)
        attn = torch.stack(out.attentions, dim=1).float().numpy()  # (B, L, H, T, T)
        correct += int((out.logits.argmax(-1).numpy() == labels[i : i + batch]).sum())
        for j, a in enumerate(attn):
            cls_row = rollout(a, num_prefix_tokens=1)[1:].reshape(grid)
            hits += peak_in_box(cls_row, tuple(boxes[i + j]), PATCH)
    n = len(images)
    return DemoScore(accuracy=correct / n, peak_in_box=hits / n, n=n)


def train_demo(
    out: str | Path,
    *,
    seed: int = 0,
    steps: int = 2000,
    batch_size: int = 64,
    train_images: int = 40_000,
    lr: float = 3e-4,
    held_out: int = 500,
    label_smoothing: float = 0.0,
    log=print,
) -> DemoScore:
    """Train the demo model from scratch and save it (HF format) under ``out``.

    Returns its score on ``held_out`` held-out images (data seed ``seed + 1``, never trained on).
    The bundled model's recipe is the default: no label smoothing and ``lr`` 3e-4. Label smoothing ``e`` caps
    the confidence at ``1 - e + e / 5`` and pins every image's logit there, where gradient-based maps go blind
    (relevance missed the squares); ``lr`` 1e-3 without it spreads the CLS attention off the shape (its rollout
    peak in the box fell below 80 %). docs/evaluate.md#why-the-demo-is-trained-this-way.
    """
    if not 0.0 <= label_smoothing < 1.0:
        raise ValueError(f"label smoothing must be in [0, 1), got {label_smoothing}")
    from transformers import ViTForImageClassification

    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    t0 = time.time()
    (images, labels, _), held = training_data(seed, train_images, held_out, log)

    model = ViTForImageClassification(demo_config())
    model.set_attn_implementation("sdpa")  # fast for training; evaluation switches to eager
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.05)
    sched = warmup_cosine(opt, steps)
    y_all = torch.from_numpy(labels)
    for step in range(steps):
        model.train()
        idx = torch.randint(len(images), (batch_size,), generator=gen)
        x = _augment(_to_pixels(images[idx.numpy()]), gen)
        loss = torch.nn.functional.cross_entropy(
            model(pixel_values=x).logits, y_all[idx], label_smoothing=label_smoothing
        )
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if (step + 1) % 250 == 0 or step + 1 == steps:
            model.set_attn_implementation("eager")
            score = score_demo(model, *(a[:200] for a in held))
            model.set_attn_implementation("sdpa")
            log(
                f"step {step + 1}/{steps} loss {loss.item():.3f} held-out acc {score.accuracy:.3f} "
                f"peak-in-box {score.peak_in_box:.3f} ({time.time() - t0:.0f} s)"
            )

    model.set_attn_implementation("eager")
    score = score_demo(model, *held)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    model.config.attn_implementation = None  # let the loader choose; vitviz asks for eager
    model.save_pretrained(out, safe_serialization=True)
    save_processor(out)
    (out / "training.json").write_text(
        json.dumps(
            {
                "seed": seed,
                "steps": steps,
                "batch_size": batch_size,
                "train_images": train_images,
                "lr": lr,
                "label_smoothing": label_smoothing,
                "seconds": round(time.time() - t0),
                "held_out": score.__dict__,
            },
            indent=2,
        )
    )
    log(f"saved to {out}: held-out accuracy {score.accuracy:.3f}, peak-in-box {score.peak_in_box:.3f}")
    return score
