"""Train and evaluate the bundled ``demo-clip`` model: a tiny CLIP trained on the synthetic shapes with captions.

The model is a Hugging Face ``CLIPModel`` with two small towers: a ViT image tower
(96 px input, 8 px patches, 12 x 12 grid, CLS readout) and a causal text tower
that reads its ``<eos>`` token, with a word-level tokenizer of its own
(:func:`vitviz.demo.tokenizer.word_tokenizer`), so typed labels work with no network.

Captions are made from what ``vitviz.data.shapes`` knows about each image: its
class and the colour word of the shape's fill (the fill is one flat colour, read
back from the pixels inside the box). Each image gets one caption from a few
templates (``"a photo of a {}."``, ``"a {}."``, ``"{}"``, ``"a red {}."``, ...); the
five class prompts in the default template ``"a photo of a {}."`` join every batch.
Captions are deduplicated per batch and the contrastive loss has several positives:
a caption is a positive of every image it describes truly (same class, and same
colour where it names one), so ``"a circle."`` matches every circle and
``"a yellow square."`` only the yellow squares. The default template and the
labels are declared in ``vitviz.json`` for the app. Training is reproducible from its seed.
"""

from __future__ import annotations

import colorsys
import json
import math
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from vitviz.data import shapes as demo_data
from vitviz.demo import BUNDLED
from vitviz.demo.tokenizer import SPECIALS, word_tokenizer
from vitviz.demo.vit import DemoScore, _augment, _to_pixels, peak_in_box, save_processor, training_data, warmup_cosine

__all__ = [
    "CLIP_DEMO_DIR",
    "TEMPLATE",
    "LABELS",
    "COLOURS",
    "PLAIN_TEMPLATES",
    "COLOUR_TEMPLATES",
    "WORDS",
    "MAX_TOKENS",
    "clip_demo_config",
    "clip_tokenizer",
    "colour_word",
    "caption",
    "score_clip_folder",
    "train_clip_demo",
]

CLIP_DEMO_DIR = BUNDLED["demo-clip"]
PATCH = 8
MAX_TOKENS = 16
TEMPLATE = "a photo of a {}."  # the default prompt template (vitviz.json), also vitviz's general default
LABELS = ", ".join(demo_data.CLASSES)
PLAIN_TEMPLATES = (TEMPLATE, "a {}.", "{}", "a {} shape.", "a picture of a {}.", "a drawing of a {}.")
COLOUR_TEMPLATES = ("a {colour} {}.", "a photo of a {colour} {}.", "a {colour} {} shape.")
# Hue bins (degrees, upper bound exclusive) -> colour word. The classes' hue ranges
# (shapes.py: class / 5 +- 0.05 of a turn) fall into: circle red (some orange),
# square yellow or lime, triangle green, cross blue, star purple or pink.
_HUES = (
    (15, "red"),
    (40, "orange"),
    (70, "yellow"),
    (100, "lime"),
    (165, "green"),
    (195, "teal"),
    (255, "blue"),
    (290, "purple"),
    (340, "pink"),
    (361, "red"),
)
COLOURS = tuple(dict.fromkeys(name for _, name in _HUES))
WORDS = ("a", "an", "photo", "picture", "drawing", "of", "shape", ".", *demo_data.CLASSES, *COLOURS)


def clip_tokenizer():
    """The demo's word-level tokenizer: ``<pad> <unk> <bos> <eos>`` then :data:`WORDS`, at most 16 tokens."""
    return word_tokenizer(WORDS, max_length=MAX_TOKENS)


def clip_demo_config(vocab: int):
    """The demo CLIP's architecture for a tokenizer of ``vocab`` ids.

    Image tower: width 96, 4 layers, 4 heads, MLP 192, 96 px / 8 px patches. Text
    tower: width 64, 2 layers, 4 heads, MLP 128, 16 positions, pooled at ``<eos>``
    (id 3). Both project to 64-d embeddings.
    """
    from transformers import CLIPConfig

    pad, _, bos, eos = range(len(SPECIALS))
    return CLIPConfig(
        text_config=dict(
            vocab_size=int(vocab),
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            max_position_embeddings=MAX_TOKENS,
            pad_token_id=pad,
            bos_token_id=bos,
            eos_token_id=eos,
        ),
        vision_config=dict(
            hidden_size=96,
            intermediate_size=192,
            num_hidden_layers=4,
            num_attention_heads=4,
            image_size=demo_data.IMAGE_SIZE,
            patch_size=PATCH,
        ),
        projection_dim=64,
    )


def colour_word(image: np.ndarray, box) -> str:
    """The colour word of the shape's fill: the most frequent exact RGB value inside its box, named by hue.

    The shape is filled with one flat colour and covers much of its box, while the
    background carries pixel noise, so the mode is the fill.
    """
    x0, y0, x1, y1 = (int(v) for v in box)
    px = np.asarray(image)[y0:y1, x0:x1].reshape(-1, 3).astype(np.int64)
    packed = (px[:, 0] << 16) | (px[:, 1] << 8) | px[:, 2]
    values, counts = np.unique(packed, return_counts=True)
    v = int(values[np.argmax(counts)])
    hue = colorsys.rgb_to_hsv((v >> 16) / 255, ((v >> 8) & 255) / 255, (v & 255) / 255)[0] * 360
    return next(name for top, name in _HUES if hue < top)


def caption(label: str, template: str, colour: str | None = None) -> str:
    """A caption: ``template`` with ``label`` at ``{}`` and the colour word at ``{colour}`` ("an" before a vowel)."""
    if "{colour}" in template:
        if colour is None:
            raise ValueError(f"'{template}' needs a colour")
        template = template.replace("{colour}", colour)
        if colour[0] in "aeiou":
            template = template.replace(f"a {colour}", f"an {colour}")
    return template.replace("{}", label, 1)


class _Captions:
    """Every caption the training draws from, tokenized once: text, class, colour (-1 = none), token ids."""

    def __init__(self, tokenizer) -> None:
        rows = [(caption(c, t), k, -1) for t in PLAIN_TEMPLATES for k, c in enumerate(demo_data.CLASSES)]
        rows += [
            (caption(c, t, colour), k, j)
            for t in COLOUR_TEMPLATES
            for k, c in enumerate(demo_data.CLASSES)
            for j, colour in enumerate(COLOURS)
        ]
        self.text = [r[0] for r in rows]
        self.label = torch.tensor([r[1] for r in rows])
        self.colour = torch.tensor([r[2] for r in rows])
        enc = tokenizer(self.text, padding="longest", truncation=True, max_length=MAX_TOKENS, return_tensors="pt")
        if (enc["input_ids"] == tokenizer.unk_token_id).any():
            raise RuntimeError("a training caption has a word outside the vocabulary")
        self.ids, self.mask = enc["input_ids"], enc["attention_mask"]
        self.n_plain_templates = len(PLAIN_TEMPLATES)
        self.n_templates = len(PLAIN_TEMPLATES) + len(COLOUR_TEMPLATES)
        self.n_plain = len(PLAIN_TEMPLATES) * len(demo_data.CLASSES)  # rows before the coloured captions
        self.default = torch.arange(len(demo_data.CLASSES))  # TEMPLATE is the first plain template

    def sample(self, labels: torch.Tensor, colours: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
        """One caption per image (a random template, true class and colour), plus the class prompts, deduplicated."""
        n_cls, n_col = len(demo_data.CLASSES), len(COLOURS)
        t = torch.randint(self.n_templates, labels.shape, generator=gen)
        plain = t * n_cls + labels
        coloured = self.n_plain + ((t - self.n_plain_templates) * n_cls + labels) * n_col + colours
        idx = torch.where(t < self.n_plain_templates, plain, coloured)
        return torch.unique(torch.cat([self.default, idx]))


def _multi_positive_loss(logits: torch.Tensor, positive: torch.Tensor) -> torch.Tensor:
    """Symmetric contrastive loss with several positives per row and column (mean log-likelihood of each positive)."""
    pos = positive.float()
    rows, cols = pos.sum(1), pos.sum(0)
    # a caption no image of the batch matches (its colour word names no image's colour) has no positive: it is
    # left out, not divided by zero (0 / 0 made every weight NaN after one step with small batches)
    img = (-(torch.log_softmax(logits, dim=1) * pos).sum(1))[rows > 0] / rows[rows > 0]
    txt = (-(torch.log_softmax(logits, dim=0) * pos).sum(0))[cols > 0] / cols[cols > 0]
    return 0.5 * (img.mean() + txt.mean())


def _save(model, tokenizer, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    impl = model.config._attn_implementation
    model.config.attn_implementation = None  # let the loader choose; vitviz asks for eager
    model.save_pretrained(out, safe_serialization=True)
    model.set_attn_implementation(impl)
    tokenizer.save_pretrained(out)
    save_processor(out)
    settings = {"prompt_template": TEMPLATE, "labels": LABELS}
    (out / "vitviz.json").write_text(json.dumps(settings, indent=2) + "\n")


def score_clip_folder(
    folder: str | Path,
    images: np.ndarray,
    labels: np.ndarray,
    boxes: np.ndarray,
    *,
    template: str | None = None,
    relevance: int | None = None,
    batch: int = 50,
) -> DemoScore:
    """Zero-shot top-1 and relevance-peak-in-box rate of a saved model, as the app computes them.

    Loads ``folder`` through vitviz, scores the labels :data:`LABELS` in ``template``
    (default: the folder's declared one) against each image's embedding from
    vitviz's capture, and takes Chefer et al.'s relevance with the chosen (top-1)
    label's image-text score as the target; a hit is its peak patch centre inside the
    shape's box. ``relevance`` limits the relevance part to the first images.
    """
    from vitviz.capture.forward import capture_batch
    from vitviz.capture.gradients import explain_targets
    from vitviz.models.load import load_model
    from vitviz.models.zeroshot import encode_labels, label_target, parse_labels, score

    loaded = load_model(str(folder), device="cpu")
    names = parse_labels(LABELS, template or loaded.text.template)
    text = encode_labels(loaded.model, loaded.text, names)
    class_of = np.array([demo_data.CLASSES.index(n) for n in names.names])
    n_rel = len(images) if relevance is None else min(relevance, len(images))
    correct = hits = 0
    for i in range(0, len(images), batch):
        pics = [Image.fromarray(a) for a in images[i : i + batch]]
        for j, cap in enumerate(capture_batch(loaded, pics, top_k=1)):
            k = int(np.argmax(score(loaded.model, loaded.text, cap.image_embedding, text).logits))
            correct += int(class_of[k] == labels[i + j])
            if i + j < n_rel:
                target = label_target(loaded.family, loaded.model, text[k])
                exp = explain_targets(loaded, pics[j], {k: (names.names[k], target)})[k]
                hits += peak_in_box(exp.patch_map(), tuple(int(v) for v in boxes[i + j]), loaded.patch_size)
    n = len(images)
    return DemoScore(accuracy=correct / n, peak_in_box=hits / max(n_rel, 1), n=n)


def train_clip_demo(
    out: str | Path,
    *,
    seed: int = 0,
    steps: int = 1000,
    batch_size: int = 64,
    train_images: int = 20_000,
    lr: float = 1e-3,
    held_out: int = 500,
    eval_every: int = 250,
    log: Callable[[str], object] = print,
) -> DemoScore:
    """Train the demo CLIP from scratch and save it (HF format, tokenizer, ``vitviz.json``) under ``out``.

    Returns its zero-shot score on ``held_out`` held-out images (data seed
    ``seed + 1``, never trained on), measured through vitviz (:func:`score_clip_folder`).
    """
    from transformers import CLIPModel

    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    t0 = time.time()
    (images, labels, boxes), held = training_data(seed, train_images, held_out, log)
    colours = np.array([COLOURS.index(colour_word(a, b)) for a, b in zip(images, boxes, strict=True)])

    tokenizer = clip_tokenizer()
    captions = _Captions(tokenizer)
    model = CLIPModel(clip_demo_config(len(tokenizer)))
    model.set_attn_implementation("sdpa")  # fast for training; vitviz captures with eager
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    rest = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.05}, {"params": rest, "weight_decay": 0.0}], lr=lr)
    sched = warmup_cosine(opt, steps)
    y_all, c_all = torch.from_numpy(labels), torch.from_numpy(colours)
    for step in range(steps):
        model.train()
        idx = torch.randint(len(images), (batch_size,), generator=gen)
        x = _augment(_to_pixels(images[idx.numpy()]), gen)
        y, c = y_all[idx], c_all[idx]
        cap = captions.sample(y, c, gen)
        img = model.visual_projection(model.vision_model(pixel_values=x).pooler_output)
        txt = model.text_projection(
            model.text_model(input_ids=captions.ids[cap], attention_mask=captions.mask[cap]).pooler_output
        )
        logits = (
            model.logit_scale.exp()
            * torch.nn.functional.normalize(img, dim=-1)
            @ (torch.nn.functional.normalize(txt, dim=-1).T)
        )
        cc = captions.colour[cap]
        positive = (y[:, None] == captions.label[cap][None, :]) & ((cc[None, :] < 0) | (c[:, None] == cc[None, :]))
        loss = _multi_positive_loss(logits, positive)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        with torch.no_grad():
            model.logit_scale.clamp_(0.0, math.log(100.0))
        if (step + 1) % eval_every == 0 and step + 1 < steps:
            model.eval()
            with tempfile.TemporaryDirectory() as tmp:
                _save(model, tokenizer, Path(tmp))
                score = score_clip_folder(tmp, *(a[:200] for a in held), relevance=100)
            log(
                f"step {step + 1}/{steps} loss {loss.item():.3f} scale {model.logit_scale.exp().item():.1f} "
                f"held-out zero-shot acc {score.accuracy:.3f} relevance peak-in-box {score.peak_in_box:.3f} "
                f"({time.time() - t0:.0f} s)"
            )

    model.eval()
    seconds = round(time.time() - t0)
    out = Path(out)
    _save(model, tokenizer, out)
    score = score_clip_folder(out, *held)
    (out / "training.json").write_text(
        json.dumps(
            {
                "seed": seed,
                "steps": steps,
                "batch_size": batch_size,
                "train_images": train_images,
                "lr": lr,
                "seconds": seconds,
                "prompt_template": TEMPLATE,
                "labels": LABELS,
                "held_out": {**score.__dict__, "seeds": [(seed + 1) * 1_000_003, (seed + 1) * 1_000_003 + held_out]},
            },
            indent=2,
        )
    )
    log(
        f"saved to {out}: held-out zero-shot accuracy {score.accuracy:.3f}, "
        f"relevance peak-in-box {score.peak_in_box:.3f} (n={score.n})"
    )
    return score
