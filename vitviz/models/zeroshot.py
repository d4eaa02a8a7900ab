"""Zero-shot labels for two-tower models (CLIP, SigLIP, SigLIP 2): labels a user types, scored by the model's own rule.

A prompt is made from each label with a template (default ``"a photo of a {}."``;
a model folder may declare its own in ``vitviz.json``); the text tower embeds
the prompts once per label set, and the image's embedding (kept in the capture)
is compared with them, so changing the labels never reruns the image capture.

Scores, as the models compute ``logits_per_image``:

* CLIP: ``logit_scale.exp() * cos(image, text)``; the probabilities are a softmax
  over the labels (they sum to 1).
* SigLIP, SigLIP 2: ``logit_scale.exp() * cos(image, text) + logit_bias``; each
  label's probability is its own sigmoid (they need not sum to 1).

Class-specific relevance for a label is Chefer et al.'s with that label's score
as the target (:func:`label_target`).
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

from vitviz.cache import BoundedCache
from vitviz.errors import ModelLoadError, VitvizError

__all__ = [
    "DEFAULT_TEMPLATE",
    "MAX_LABELS",
    "MAX_LABEL_CHARS",
    "MAX_LABELS_TEXT",
    "ZeroShotError",
    "Labels",
    "TextTower",
    "Scores",
    "parse_labels",
    "text_tower",
    "text_tower_note",
    "unknown_words",
    "vocabulary_warning",
    "encode_labels",
    "text_embeddings",
    "forget_text_embeddings",
    "score",
    "from_logits",
    "label_target",
    "label_scores",
    "rank",
    "legend",
]

DEFAULT_TEMPLATE = "a photo of a {}."
MAX_LABELS = 64  # more would make the per-label views unreadable; the rest are dropped with a note
MAX_LABEL_CHARS = 100
MAX_TEMPLATE_CHARS = 200
MAX_LABELS_TEXT = 10_000  # characters of label text read (app and CLI); the rest is dropped with a note
SETTINGS_FILE = "vitviz.json"  # {"prompt_template": "...", "labels": "..."} declared by a model folder (demo-clip)


class ZeroShotError(VitvizError):
    """Labels or a template vitviz cannot use, or a model without a text tower."""


@dataclass(frozen=True)
class Labels:
    """Labels as given (cleaned), the prompts made from them, and what was done to them."""

    names: tuple[str, ...]
    prompts: tuple[str, ...]
    template: str
    notes: tuple[str, ...] = ()


def parse_labels(text: str, template: str = DEFAULT_TEMPLATE) -> Labels:
    """Labels from what a user typed: one per line, or comma-separated on one line.

    Whitespace is trimmed, empty entries and repeats dropped (one note names the repeats);
    a label longer than ``MAX_LABEL_CHARS`` is cut, more than ``MAX_LABELS`` labels are cut
    to the first ones, and text beyond ``MAX_LABELS_TEXT`` characters is not read, each
    with a note saying so. Linear in the length of the text. ``{}`` in the template marks
    where the label goes (exactly one; ``"{}"`` uses the labels as they are).
    """
    template = (template or "").strip() or "{}"
    if template.count("{}") != 1:  # a second {} stayed in every prompt as text, silently
        raise ZeroShotError(
            f"The prompt template needs {{}} exactly once, where the label goes (it has {template.count('{}')}), "
            f"e.g. '{DEFAULT_TEMPLATE}'."
        )
    if len(template) > MAX_TEMPLATE_CHARS:
        raise ZeroShotError(
            f"The prompt template is {len(template)} characters long; keep it under {MAX_TEMPLATE_CHARS}."
        )
    text = text or ""
    notes: list[str] = []
    if len(text) > MAX_LABELS_TEXT:  # bounds all the work below (linear in what is kept)
        kept = text[:MAX_LABELS_TEXT]
        cut = kept.rfind("\n") if "\n" in kept.strip() else kept.rfind(",")  # the last whole label
        notes.append(f"The labels text is {len(text):,} characters long; only the first {MAX_LABELS_TEXT:,} were read.")
        text = kept[:cut] if cut > 0 else kept
    lines = [ln for ln in text.splitlines() if ln.strip()]
    raw = lines if len(lines) > 1 else (lines[0].split(",") if lines else [])
    names: dict[str, int] = {}  # label -> times given (insertion-ordered): linear in the number of labels
    for item in raw:
        label = " ".join(item.split())
        if not label:
            continue
        if len(label) > MAX_LABEL_CHARS:
            notes.append(f"'{label[:30]}…' was cut to its first {MAX_LABEL_CHARS} characters.")
            label = label[:MAX_LABEL_CHARS].rstrip()
        names[label] = names.get(label, 0) + 1
    repeated = [(name, n) for name, n in names.items() if n > 1]
    if repeated:
        shown = ", ".join(f"'{name[:30]}' {'twice' if n == 2 else f'{n:,} times'}" for name, n in repeated[:3])
        more = f" and {len(repeated) - 3:,} more" if len(repeated) > 3 else ""
        notes.append(f"Repeated labels are scored once: {shown}{more}.")
    if len(notes) > 8:  # one note per long label at most MAX_LABELS_TEXT / MAX_LABEL_CHARS of them: keep a few
        notes = [*notes[:7], f"{len(notes) - 7} more notes like these."]
    names = list(names)
    if not names:
        raise ZeroShotError("Type at least one label (one per line, or separated by commas), e.g. 'cat, dog, car'.")
    if len(names) > MAX_LABELS:
        notes.append(f"{len(names)} labels were given; the first {MAX_LABELS} are scored.")
        names = names[:MAX_LABELS]
    prompts = tuple(template.replace("{}", name, 1) for name in names)
    return Labels(tuple(names), prompts, template, tuple(notes))


@dataclass(frozen=True, eq=False)
class TextTower:
    """What zero-shot scoring needs besides the model: its tokenizer, how it pads, its rule and default template."""

    tokenizer: Any = field(repr=False)
    padding: Literal["max_length", "longest"]
    max_length: int
    rule: Literal["softmax", "sigmoid"]
    template: str
    labels: str = ""  # labels the model folder suggests (vitviz.json), e.g. the demo's classes


def _projection_problems(model: torch.nn.Module, missing: Sequence[str]) -> list[str]:
    """Parts of the text-image comparison a checkpoint did not provide (they would be random)."""
    wanted = ("visual_projection", "text_projection", "logit_scale", "logit_bias")
    present = [w for w in wanted if hasattr(model, w)]
    return [k for k in missing if any(k == w or k.startswith(f"{w}.") for w in present)]


def text_tower(
    model: torch.nn.Module, source: str, hub_kwargs: dict, missing_keys: Sequence[str] = ()
) -> TextTower | None:
    """The text side of a two-tower model, or None when the model has none (an image-only checkpoint).

    Raises :class:`ModelLoadError` when the checkpoint lacks what compares the towers
    (a projection, the logit scale or bias), naming what is missing, or when the
    towers' embeddings would not have the same width.
    """
    if not hasattr(model, "get_text_features"):
        return None
    problems = _projection_problems(model, missing_keys)
    if problems:
        raise ModelLoadError(
            f"'{source}' has a text and an image tower but its checkpoint lacks {', '.join(sorted(problems))}: "
            "without them the towers cannot be compared. Use a complete checkpoint."
        )
    text_dim, image_dim = _embedding_widths(model)
    if text_dim and image_dim and text_dim != image_dim:
        raise ModelLoadError(
            f"'{source}': the text tower gives {text_dim}-d embeddings and the image tower {image_dim}-d; "
            "the towers disagree, so no label can be compared with an image."
        )
    from transformers import AutoTokenizer

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tokenizer = AutoTokenizer.from_pretrained(source, trust_remote_code=False, **hub_kwargs)
    except Exception:  # no tokenizer files: the image side still works, without typed labels
        return None
    from vitviz.models.text_hooks import install_text_hooks

    install_text_hooks(model)  # once, before the model is shared: prompt-word relevance reads the text attention
    config = model.config
    text_config = getattr(config, "text_config", config)
    siglip = hasattr(model, "logit_bias")
    max_len = int(getattr(text_config, "max_position_embeddings", 77))
    return TextTower(
        tokenizer=tokenizer,
        padding="max_length" if siglip else "longest",  # SigLIP was trained on max-length padding
        max_length=max_len,
        rule="sigmoid" if siglip else "softmax",
        template=_declared(source, "prompt_template") or DEFAULT_TEMPLATE,
        labels=_declared(source, "labels") or "",
    )


def text_tower_note(model: torch.nn.Module, source: str) -> str:
    """Why a model with a text tower has no zero-shot labels (its folder has no tokenizer); "" when it has no text tower."""
    if not hasattr(model, "get_text_features"):
        return ""
    return (
        f"'{source}' has a text tower, but its folder has no tokenizer files (tokenizer.json, or the tokenizer's "
        "vocabulary): zero-shot labels need the tokenizer. Copy the tokenizer files of the checkpoint it came from "
        "into the folder; until then only the image tower's views work."
    )


def unknown_words(tower: TextTower, labels: Labels) -> dict[str, tuple[str, ...]]:
    """Per label, the words of its prompt the tokenizer reads as its unknown token (labels without any are left out).

    A word is the text the unknown token stands for, as the tokenizer cut it
    (fast tokenizers' offsets); the template's words count too, since the text
    tower reads the whole prompt. A tokenizer without an unknown token
    (byte-level BPE, as CLIP's) knows every word: ``{}``.
    """
    tok = tower.tokenizer
    unk = getattr(tok, "unk_token_id", None)
    if unk is None:
        return {}
    found: dict[str, tuple[str, ...]] = {}
    for name, prompt in zip(labels.names, labels.prompts, strict=True):
        if getattr(tok, "is_fast", False):
            enc = tok(prompt, add_special_tokens=False, return_offsets_mapping=True)
            words = [prompt[a:b] for i, (a, b) in zip(enc["input_ids"], enc["offset_mapping"], strict=True) if i == unk]
        else:  # slow tokenizers have no offsets: ask word by word
            words = [w for w in prompt.split() if unk in tok(w, add_special_tokens=False)["input_ids"]]
        words = [w for w in dict.fromkeys(words) if w.strip()]
        if words:
            found[name] = tuple(words)
    return found


def vocabulary_warning(tower: TextTower, labels: Labels, model_name: str) -> str:
    """A warning naming the words of the prompts the model's tokenizer does not know ("" when it knows them all)."""
    found = unknown_words(tower, labels)
    if not found:
        return ""
    words = ", ".join(f"'{w}'" for w in dict.fromkeys(w for ws in found.values() for w in ws))
    names = ", ".join(f"'{n}'" for n in found)
    return (
        f"{model_name}'s tokenizer does not know {words}: the text tower reads each as one unknown token, so "
        f"the scores of {names} say nothing about {'that word' if words.count(',') == 0 else 'those words'} "
        "(labels differing only there get the same score). Use words the model knows"
        + (f", e.g. {tower.labels}." if tower.labels else ".")
    )


def _out_features(layer) -> int | None:
    return int(layer.out_features) if isinstance(layer, torch.nn.Linear) else None


def _embedding_widths(model: torch.nn.Module) -> tuple[int | None, int | None]:
    """Widths of the text and image embeddings the model compares: its projections, else its towers' heads."""
    config = model.config
    text_cfg, vision_cfg = getattr(config, "text_config", None), getattr(config, "vision_config", None)
    text = _out_features(getattr(model, "text_projection", None))
    if text is None and text_cfg is not None:  # SigLIP: the text tower's head, projection_size wide
        text = getattr(text_cfg, "projection_size", None) or getattr(text_cfg, "hidden_size", None)
    image = _out_features(getattr(model, "visual_projection", None))
    if image is None and vision_cfg is not None:  # SigLIP: the pooling head keeps the tower's width
        image = getattr(vision_cfg, "hidden_size", None)
    return text, image


def _declared(source: str, key: str) -> str | None:
    """A setting the model folder declares in ``vitviz.json`` (a template must hold ``{}``)."""
    path = Path(source) / SETTINGS_FILE
    if not path.is_file():
        return None
    try:
        value = json.loads(path.read_text()).get(key)
    except (OSError, ValueError, AttributeError):
        return None
    if not isinstance(value, str) or (key == "prompt_template" and "{}" not in value):
        return None
    return value


@torch.inference_mode()
def encode_labels(model: torch.nn.Module, tower: TextTower, labels: Labels, *, chunk: int = 32) -> np.ndarray:
    """The text tower's embedding of every prompt, as the model computes it: ``(K, D)`` float32 (not normalised)."""
    device = next(model.parameters()).device
    out = []
    for i in range(0, len(labels.prompts), chunk):
        batch = tower.tokenizer(
            list(labels.prompts[i : i + chunk]),
            padding=tower.padding,
            truncation=True,
            max_length=tower.max_length,
            return_tensors="pt",
        )
        batch = {k: v.to(device) for k, v in batch.items() if k in ("input_ids", "attention_mask", "position_ids")}
        if tower.padding == "max_length":
            batch.pop("attention_mask", None)  # SigLIP's text tower attends over the padding it was trained with
        if _pools_last(model) and set(batch) == {"input_ids"}:
            feats = _last_token_features(model.text_model, batch["input_ids"])
        else:
            feats = model.get_text_features(**batch)
            feats = getattr(feats, "pooler_output", feats)
        out.append(feats.float().cpu().numpy())
    return np.concatenate(out)


# Text-tower embeddings per (model, prompt): a prompt's embedding does not depend on the others in its batch (CLIP
# masks the padding, SigLIP always pads to its full length), so editing one label encodes that prompt alone. The one
# cache of label embeddings: the Run's label scores, targets bound to a model and the app's labels all read it.
_TEXT: BoundedCache[np.ndarray] = BoundedCache(max_entries=4096, max_bytes=64 * 2**20, size_of=lambda e: int(e.nbytes))


def text_embeddings(loaded, prompts: Sequence[str]) -> np.ndarray:
    """The text tower's embeddings of ``prompts`` ``(K, D)`` float32 (as :func:`encode_labels`), cached per prompt:
    only prompts not seen before with this model run the text tower. Raises :class:`ZeroShotError` for a model
    without text tower."""
    if getattr(loaded, "text", None) is None:
        raise ZeroShotError(
            getattr(loaded, "text_note", "")
            or f"'{loaded.name}' has no text tower: labels need a CLIP- or SigLIP-style two-tower checkpoint."
        )
    model = loaded.model

    def key(p: str) -> tuple:
        return (id(model), loaded.name, p)

    def encode(batch: tuple[str, ...]) -> np.ndarray:
        return encode_labels(model, loaded.text, Labels(batch, batch, "{}"))

    prompts = tuple(prompts)
    missing = tuple(p for p in dict.fromkeys(prompts) if key(p) not in _TEXT)
    if missing:
        for p, e in zip(missing, encode(missing), strict=True):
            _TEXT.get_or_compute(key(p), lambda e=e: e)
    return np.stack([_TEXT.get_or_compute(key(p), lambda p=p: encode((p,))[0]) for p in prompts])


def forget_text_embeddings(model: torch.nn.Module | None = None) -> None:
    """Drop the cached prompt embeddings (of ``model`` only, when given)."""
    _TEXT.discard(lambda k, _v: model is None or k[0] == id(model))


def _pools_last(model: torch.nn.Module) -> bool:
    """A SigLIP-style text tower (``SiglipTextModel``): pre-norm layers, then ``head(final_norm(h)[:, -1])``."""
    text = getattr(model, "text_model", None)
    return type(text).__name__ in ("SiglipTextModel", "Siglip2TextModel") and hasattr(text, "head")


def _last_token_features(text: torch.nn.Module, input_ids: torch.Tensor) -> torch.Tensor:
    """``SiglipTextModel``'s pooled output, computing the last block for the pooled (last) token only.

    The tower reads ``head(final_layer_norm(h)[:, -1])``: in the last block every token's keys and
    values are needed, but only the last token's query, attention output and MLP, which saves
    about 5/6 of that block's work. The same numbers as ``get_text_features`` (the test checks it).
    """
    h = text.embeddings(input_ids=input_ids)  # (B, T, D)
    layers = text.encoder.layers
    for layer in layers[:-1]:
        h = layer(h, None)
        h = h[0] if isinstance(h, tuple) else h
    last, att = layers[-1], layers[-1].self_attn
    x = last.layer_norm1(h)
    b, t, d = x.shape
    heads, hd = att.num_heads, att.head_dim
    q = att.q_proj(x[:, -1:]).view(b, 1, heads, hd).transpose(1, 2)  # (B, H, 1, hd)
    k = att.k_proj(x).view(b, t, heads, hd).transpose(1, 2)  # (B, H, T, hd)
    v = att.v_proj(x).view(b, t, heads, hd).transpose(1, 2)
    w = torch.softmax(torch.matmul(q, k.transpose(-1, -2)) * att.scale, dim=-1, dtype=torch.float32).to(q.dtype)
    y = h[:, -1:] + att.out_proj(torch.matmul(w, v).transpose(1, 2).reshape(b, 1, d))
    y = y + last.mlp(last.layer_norm2(y))
    return text.head(text.final_layer_norm(y)[:, 0])


@dataclass(frozen=True, eq=False)
class Scores:
    """``logits`` ``(K,)`` (the model's ``logits_per_image``) and ``probabilities`` ``(K,)`` by the model's rule."""

    logits: np.ndarray
    probabilities: np.ndarray
    rule: Literal["softmax", "sigmoid"]


def label_scores(model: torch.nn.Module, image_embedding: torch.Tensor, text) -> torch.Tensor:
    """A two-tower model's ``logits_per_image`` for K labels: ``logit_scale.exp() * cos(image, text_k)``, plus
    ``logit_bias`` for SigLIP. ``(B, D)`` image embeddings x ``(K, D)`` label embeddings -> ``(B, K)``,
    differentiable in the image embedding (float64 in, float64 out). The one place vitviz computes label scores."""
    t = text if isinstance(text, torch.Tensor) else torch.as_tensor(np.asarray(text, np.float32))
    img = image_embedding / image_embedding.norm(dim=-1, keepdim=True)
    unit = (t / t.norm(dim=-1, keepdim=True)).to(img.device, img.dtype)
    got = model.logit_scale.exp() * img @ unit.T
    bias = getattr(model, "logit_bias", None)
    return got + bias if isinstance(bias, torch.Tensor) else got


def _scale_bias(model: torch.nn.Module) -> tuple[float, float]:
    scale = float(model.logit_scale.detach().float().exp())
    bias = float(model.logit_bias.detach().float()) if hasattr(model, "logit_bias") else 0.0
    return scale, bias


def from_logits(logits: np.ndarray, rule: Literal["softmax", "sigmoid"]) -> Scores:
    """Probabilities of label scores ``(K,)`` by the model's rule (e.g. the scores after a knock-out)."""
    z = np.asarray(logits, np.float64)
    if rule == "softmax":
        e = np.exp(z - z.max())
        probs = e / e.sum()
    else:
        probs = 1.0 / (1.0 + np.exp(-z))
    return Scores(np.asarray(logits, np.float32), probs, rule)


def score(model: torch.nn.Module, tower: TextTower, image_embedding: np.ndarray, text: np.ndarray) -> Scores:
    """Scores of one image ``(D,)`` against K label embeddings ``(K, D)``, as the model's forward computes them."""
    img = torch.as_tensor(np.asarray(image_embedding, np.float64))[None]
    txt = torch.as_tensor(np.asarray(text, np.float64))
    with torch.no_grad():
        logits = label_scores(model, img, txt)[0].cpu().numpy()
    return from_logits(logits, tower.rule)


def label_target(family, model: torch.nn.Module, text_embedding: np.ndarray):
    """A relevance target: the forward's output -> this label's score (a logit before softmax or sigmoid)."""
    t = torch.as_tensor(np.asarray(text_embedding, np.float32)).reshape(1, -1)

    def target(out) -> torch.Tensor:
        return label_scores(model, family.image_embedding(model, out)[:1], t)[0, 0]

    return target


def rank(scores: Scores, names: Sequence[str]):
    """Every label as a :class:`~vitviz.record.Prediction`, most probable first (ties: given order)."""
    from vitviz.record import Prediction

    order = np.argsort(-scores.probabilities, kind="stable")
    return tuple(Prediction(int(i), names[i], float(scores.probabilities[i]), float(scores.logits[i])) for i in order)


def legend(rule: Literal["softmax", "sigmoid"]) -> str:
    """How to read the probabilities, for legends and titles."""
    if rule == "softmax":
        return "zero-shot: softmax over the labels"
    return "zero-shot: each label's own sigmoid (they need not sum to 1)"
