"""Synthetic data for the bundled ``demo`` model: shapes on cluttered backgrounds.

Every image holds exactly one large filled shape (the label) on a background of
muted colour gradients, thin lines and small blobs (the clutter, all of low
saturation). Each class has a vivid hue range of its own besides its shape: a
model small enough to train on a laptop CPU in minutes then learns quickly, and
all its evidence sits on the object, so its attention has something to show. The shape's tight
bounding box is recorded, so tests can check that the model's attention lands on
the object rather than on the clutter.

Everything is a pure function of the seed: the same seed gives the same images.
"""

from __future__ import annotations

import colorsys
import csv
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

__all__ = ["CLASSES", "IMAGE_SIZE", "Sample", "make_sample", "make_batch", "write_dataset"]

CLASSES: tuple[str, ...] = ("circle", "square", "triangle", "cross", "star")
IMAGE_SIZE = 96  # pixels; the demo ViT uses 8-pixel patches, so a 12 x 12 grid


@dataclass(frozen=True)
class Sample:
    image: Image.Image  # RGB, IMAGE_SIZE x IMAGE_SIZE
    label: int  # index into CLASSES
    box: tuple[int, int, int, int]  # (x0, y0, x1, y1) in pixels, x1/y1 exclusive
    # (size, size) bool: the pixels of the shape itself, as drawn (the shape is drawn last: nothing covers it)
    mask: np.ndarray | None = field(default=None, compare=False, repr=False)


def _polygon(kind: str, cx: float, cy: float, r: float, angle: float) -> list[tuple[float, float]]:
    if kind == "square":
        pts = [(math.cos(a), math.sin(a)) for a in (math.pi / 4 + k * math.pi / 2 for k in range(4))]
        pts = [(x * 0.9, y * 0.9) for x, y in pts]
    elif kind == "triangle":
        pts = [(math.cos(a), math.sin(a)) for a in (-math.pi / 2 + k * 2 * math.pi / 3 for k in range(3))]
    elif kind == "star":
        pts = [
            ((1.0 if k % 2 == 0 else 0.45) * math.cos(a), (1.0 if k % 2 == 0 else 0.45) * math.sin(a))
            for k, a in enumerate(-math.pi / 2 + k * math.pi / 5 for k in range(10))
        ]
    elif kind == "cross":
        w = 0.33
        pts = [
            (-w, -1),
            (w, -1),
            (w, -w),
            (1, -w),
            (1, w),
            (w, w),
            (w, 1),
            (-w, 1),
            (-w, w),
            (-1, w),
            (-1, -w),
            (-w, -w),
        ]
    else:  # pragma: no cover - guarded by the caller
        raise ValueError(kind)
    ca, sa = math.cos(angle), math.sin(angle)
    return [(cx + r * (x * ca - y * sa), cy + r * (x * sa + y * ca)) for x, y in pts]


def _muted(rng: np.random.Generator) -> tuple[int, int, int]:
    """A low-saturation colour: clutter varies in brightness and texture, never in vivid hue."""
    rgb = colorsys.hsv_to_rgb(rng.uniform(0, 1), rng.uniform(0.0, 0.3), rng.uniform(0.1, 1.0))
    return tuple(int(v * 255) for v in rgb)


def _background(rng: np.random.Generator, size: int) -> Image.Image:
    c0, c1 = np.array(_muted(rng), float), np.array(_muted(rng), float)
    t = np.linspace(0.0, 1.0, size)
    theta = rng.uniform(0, 2 * math.pi)
    ramp = np.clip(0.5 + (np.cos(theta) * (t[None, :] - 0.5) + np.sin(theta) * (t[:, None] - 0.5)), 0, 1)
    arr = c0 * (1 - ramp[..., None]) + c1 * ramp[..., None]
    arr += rng.normal(0, 8, arr.shape)  # sensor-like noise
    img = Image.fromarray(np.clip(arr, 0, 255).astype(np.uint8), "RGB")
    draw = ImageDraw.Draw(img)
    for _ in range(rng.integers(4, 10)):  # thin lines across the image
        x0, y0, x1, y1 = rng.uniform(-10, size + 10, 4)
        draw.line([(x0, y0), (x1, y1)], fill=_muted(rng), width=int(rng.integers(1, 3)))
    for _ in range(rng.integers(5, 14)):  # small blobs, far smaller than any shape
        x, y = rng.uniform(0, size, 2)
        s = rng.uniform(1.5, 4.5)
        if rng.random() < 0.5:
            draw.ellipse([x - s, y - s, x + s, y + s], fill=_muted(rng))
        else:
            draw.rectangle([x - s, y - s, x + s, y + s], fill=_muted(rng))
    return img


def _shape_colour(rng: np.random.Generator, label: int, local: np.ndarray) -> tuple[int, int, int]:
    """A vivid colour in the class's own hue range, drawn until it stands out from the local background."""
    hue = (label / len(CLASSES) + rng.uniform(-0.05, 0.05)) % 1.0
    for _ in range(50):
        rgb = np.array(colorsys.hsv_to_rgb(hue, rng.uniform(0.55, 1.0), rng.uniform(0.45, 1.0))) * 255
        if np.abs(rgb - local).sum() >= 150:
            break
    return tuple(int(v) for v in rgb)


def make_sample(seed: int, *, size: int = IMAGE_SIZE, label: int | None = None) -> Sample:
    """One image, its label, the shape's tight bounding box and its pixel mask, from ``seed`` alone."""
    rng = np.random.default_rng(seed)
    label = int(rng.integers(len(CLASSES))) if label is None else int(label)
    img = _background(rng, size)
    r = rng.uniform(0.17, 0.30) * size  # shape radius: box side 34-60 % of the image
    cx, cy = rng.uniform(r + 2, size - r - 2, 2)
    fill = _shape_colour(rng, label, np.asarray(img, dtype=np.float32)[int(cy), int(cx)])

    mask = Image.new("L", (size, size), 0)
    mdraw = ImageDraw.Draw(mask)
    kind = CLASSES[label]
    if kind == "circle":
        mdraw.ellipse([cx - r, cy - r, cx + r, cy + r], fill=255)
    else:
        mdraw.polygon(_polygon(kind, cx, cy, r, rng.uniform(0, 2 * math.pi)), fill=255)
    img.paste(Image.new("RGB", (size, size), fill), (0, 0), mask)
    pixels = np.asarray(mask) > 0
    ys, xs = np.nonzero(pixels)
    box = (int(xs.min()), int(ys.min()), int(xs.max()) + 1, int(ys.max()) + 1)
    return Sample(image=img, label=label, box=box, mask=pixels)


def make_batch(seeds: range | list[int], *, size: int = IMAGE_SIZE) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Images ``(B, size, size, 3)`` uint8, labels ``(B,)`` int64 and boxes ``(B, 4)`` int64."""
    samples = [make_sample(s, size=size) for s in seeds]
    images = np.stack([np.asarray(s.image) for s in samples])
    labels = np.array([s.label for s in samples], dtype=np.int64)
    boxes = np.array([s.box for s in samples], dtype=np.int64)
    return images, labels, boxes


def write_dataset(out: str | Path, *, n: int, seed: int, size: int = IMAGE_SIZE) -> Path:
    """Write ``n`` PNG images and ``labels.csv`` (file, label, x0, y0, x1, y1) under ``out``.

    Image ``i`` is ``make_sample(seed * 1_000_003 + i)``, so two sets with different
    seeds do not overlap in practice. Returns the CSV path.
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    csv_path = out / "labels.csv"
    with csv_path.open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["file", "label", "x0", "y0", "x1", "y1"])
        for i in range(n):
            s = make_sample(seed * 1_000_003 + i, size=size)
            name = f"{CLASSES[s.label]}_{seed}_{i:05d}.png"
            s.image.save(out / name)
            writer.writerow([name, CLASSES[s.label], *s.box])
    return csv_path
