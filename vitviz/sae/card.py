"""A feature's card: its top examples as crops with its map, and its direct effect on the read-out.

**Direct effect** (a first-order, direct-path approximation, as Neuronpedia's "logit weights"): the feature's
decoder row ``d = W_dec[i]`` is a direction in the residual stream at the SAE's point. Added there, on the direct
path (the later blocks' own updates left out) it reaches the final norm unchanged. The final LayerNorm is taken
with its **weight only**: ``LN(x) = gamma * (x - mean(x)) / sigma + beta`` becomes ``gamma * (d - mean(d))``:
the centring is exact (linear), the scale ``sigma`` (a per-image number) is set to 1 and the shift ``beta`` is
left out (it does not depend on the feature). Then the read-out's linear part:

* a classifier: the adapter's head (``family.readout_head``) as if ``d`` were on every token the head reads (the
  CLS token; CLS and DIST for distilled DeiT; CLS and the mean patch for a DINOv2 classifier; the mean patch for
  BEiT), without its bias: ``effect[c] = W_head[c] . (gamma * (d - mean(d)))`` for each class c;
* a CLIP model: the vision tower's ``post_layernorm`` weight, then ``visual_projection``: the direction ``u`` in the
  image-embedding space; a SigLIP model: ``post_layernorm``'s weight, then the attention-pooling head's value and
  output projections (its attention weights sum to 1, so a direction on every token passes through them as is;
  the head's LayerNorm and MLP branch are left out). A label's effect is ``u . t / |t|`` with ``t`` the label's
  text embedding (the scale ``logit_scale / |image embedding|`` of the score, the same for every label of one
  image, left out).

Every number is relative: the same ``sigma`` divides every class's effect, so the ranking of classes (and the
sign of each effect) is the model's own on the direct path. **Finding features by a label**
(:func:`features_for_label`): each feature's direct-effect direction ``u_i`` (above, in the image-embedding
space) ranked by its cosine with the label's text embedding, ``cos(u_i, t) = u_i . t / (|u_i| |t|)``.

Defined for an SAE on the residual stream (``embed.out``, ``blocks.{i}.in``, ``blocks.{i}.resid_mid``,
``blocks.{i}.out``) of a one-grid model whose read-out vitviz describes; refused with the reason otherwise.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch

from vitviz.sae.model import SAEError, SparseAutoencoder

__all__ = [
    "Readout",
    "Crop",
    "direct_effects",
    "label_effects",
    "cosines",
    "top_effects",
    "readout_for",
    "feature_effects",
    "features_for_label",
    "example_crops",
]

_RESIDUAL = re.compile(r"embed\.out|blocks\.\d+\.(in|out|resid_mid)")


# --- the arithmetic (pure) ----------------------------------------------------------------------------------


def direct_effects(directions: np.ndarray, gamma: np.ndarray, weight: np.ndarray, *, centre: bool = True) -> np.ndarray:
    """``(F, C)``: each direction ``(F, D)`` centred (``d - mean(d)``, the LayerNorm's centring), times the norm's
    weight ``gamma`` ``(D,)``, through the linear map ``weight`` ``(C, D)``: ``(gamma * (d - mean d)) @ weight.T``
    (float64)."""
    d = np.atleast_2d(np.asarray(directions, np.float64))
    if centre:
        d = d - d.mean(axis=1, keepdims=True)
    return (d * np.asarray(gamma, np.float64)) @ np.asarray(weight, np.float64).T


def label_effects(embedding_directions: np.ndarray, label_embeddings: np.ndarray) -> np.ndarray:
    """``(F, K)``: each image-embedding direction ``u`` ``(F, E)`` against each label's unit text embedding:
    ``u . t_k / |t_k|``."""
    t = np.atleast_2d(np.asarray(label_embeddings, np.float64))
    unit = t / np.maximum(np.linalg.norm(t, axis=1, keepdims=True), 1e-12)
    return np.atleast_2d(np.asarray(embedding_directions, np.float64)) @ unit.T


def cosines(directions: np.ndarray, target: np.ndarray) -> np.ndarray:
    """``(F,)``: the cosine of each direction ``(F, E)`` with ``target`` ``(E,)`` (0 for a zero direction)."""
    u = np.atleast_2d(np.asarray(directions, np.float64))
    t = np.asarray(target, np.float64).ravel()
    norms = np.linalg.norm(u, axis=1) * np.linalg.norm(t)
    dots = u @ t
    return np.where(norms > 0, dots / np.where(norms > 0, norms, 1.0), 0.0)


def top_effects(
    effects: np.ndarray, names: Sequence[str], n: int = 8
) -> tuple[list[tuple[str, float]], list[tuple[str, float]]]:
    """The ``n`` most positive effects (largest first) and the ``n`` most negative (most negative first), as
    ``(name, effect)``; a class appears in one list only (ties: the lower index first)."""
    e = np.asarray(effects, np.float64).ravel()
    order = np.argsort(-e, kind="stable")
    pos = [(names[i], float(e[i])) for i in order[:n] if e[i] > 0]
    neg_order = np.argsort(e, kind="stable")
    neg = [(names[i], float(e[i])) for i in neg_order[:n] if e[i] < 0]
    return pos, neg


# --- the model's read-out ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Readout:
    """The linear part of a model's read-out after its final norm (module docstring): ``gamma`` ``(D,)`` the
    final norm's weight; ``weight`` ``(C, D)`` the classes' rows (``kind == "classes"``, ``names`` their labels)
    or the image-embedding projection ``(E, D)`` (``kind == "embedding"``: zero-shot, compared with labels)."""

    gamma: np.ndarray
    weight: np.ndarray
    kind: Literal["classes", "embedding"]
    names: tuple[str, ...]
    description: str


def _why_not_residual(point: str | None) -> str | None:
    if point is None:
        return "this SAE does not say which point it reads"
    if not _RESIDUAL.fullmatch(point):
        return (
            f"the direct effect is defined for an SAE on the residual stream (embed.out, blocks.N.in, "
            f"blocks.N.resid_mid, blocks.N.out); {point} is not added to it as it is"
        )
    return None


def readout_for(loaded, point: str | None) -> Readout:
    """The read-out the SAE's ``point`` feeds directly (module docstring), or :class:`SAEError` saying why none."""
    from vitviz.models.families.contrastive import pooling_head, vision_tower

    why = _why_not_residual(point)
    if why:
        raise SAEError(why)
    fam, model = loaded.family, loaded.model
    if getattr(fam, "hierarchical", False):
        raise SAEError(
            f"{fam.name} changes its token grid and width between stages: a direction at {point} does not reach "
            "the read-out as it is"
        )
    if loaded.has_classifier:
        head = fam.readout_head(model)
        norm = getattr(head, "norm", None)
        if head is None or not isinstance(norm, torch.nn.LayerNorm) or norm.weight is None:
            raise SAEError(
                f"the {fam.name} adapter describes no read-out (final LayerNorm + linear classifier) a direction "
                "can pass through"
            )
        dim = norm.weight.numel()
        with torch.no_grad():
            w = norm.weight
            eye = torch.eye(dim, dtype=w.dtype, device=w.device)[:, None, :].expand(dim, 2, dim)
            zero = torch.zeros(1, 2, dim, dtype=w.dtype, device=w.device)
            weight = (head.head(eye) - head.head(zero)).float().cpu().numpy().T  # (C, D): the head's linear part
        names = tuple(
            (loaded.id2label or {}).get(i, str(i)) if loaded.id2label else str(i) for i in range(weight.shape[0])
        )
        gamma = norm.weight.detach().float().cpu().numpy()
        return Readout(gamma, weight, "classes", names, head.description)
    if not loaded.zero_shot:
        raise SAEError(f"'{loaded.name}' has no classifier and no text tower: there is no read-out to reach")
    tower = vision_tower(model)
    post = getattr(tower, "post_layernorm", None)
    if not isinstance(post, torch.nn.LayerNorm) or post.weight is None:
        raise SAEError(f"'{loaded.name}''s image tower has no final LayerNorm vitviz can read")
    gamma = post.weight.detach().float().cpu().numpy()
    proj = getattr(model, "visual_projection", None)
    if isinstance(proj, torch.nn.Linear):
        weight = proj.weight.detach().float().cpu().numpy()
        return Readout(gamma, weight, "embedding", (), "post_layernorm's weight, then visual_projection")
    found = pooling_head(tower)
    if found is not None:
        mha = found[1]
        e = mha.embed_dim
        w_v = mha.in_proj_weight[2 * e :] if mha.in_proj_weight is not None else mha.v_proj_weight
        weight = (mha.out_proj.weight.detach().float() @ w_v.detach().float()).cpu().numpy()
        return Readout(
            gamma,
            weight,
            "embedding",
            (),
            "post_layernorm's weight, then the pooling head's value and output projections (its LayerNorm and MLP "
            "left out)",
        )
    raise SAEError(f"vitviz does not describe how '{loaded.name}' projects its image tower into the text space")


def feature_effects(sae: SparseAutoencoder, readout: Readout, features: Sequence[int] | None = None) -> np.ndarray:
    """``(F, C)`` (or ``(F, E)`` for an embedding read-out): the direct effect of each feature's decoder row
    (all features, or ``features``)."""
    w = sae.W_dec.detach().float().cpu().numpy()
    if features is not None:
        w = w[np.asarray(features, np.int64)]
    if w.shape[1] != readout.gamma.shape[0]:
        raise SAEError(f"the SAE is {w.shape[1]} wide, the read-out {readout.gamma.shape[0]}: it reads another model")
    return direct_effects(w, readout.gamma, readout.weight)


def features_for_label(
    sae: SparseAutoencoder, readout: Readout, text_embedding: np.ndarray, *, top: int = 20
) -> list[tuple[int, float]]:
    """The ``top`` features whose direct-effect direction is closest to the label's text embedding (largest cosine
    first): ``[(feature, cosine), ...]``."""
    if readout.kind != "embedding":
        raise SAEError("finding features by a label needs a CLIP- or SigLIP-style model (an image-embedding read-out)")
    t = np.asarray(text_embedding, np.float64).ravel()
    if t.shape[0] != readout.weight.shape[0]:
        raise SAEError(f"the label embedding is {t.shape[0]} wide, the image embedding {readout.weight.shape[0]}")
    cos = cosines(feature_effects(sae, readout), t)
    order = np.argsort(-cos, kind="stable")[:top]
    return [(int(i), float(cos[i])) for i in order]


# --- the top examples as crops ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Crop:
    """One top example drawn: ``image`` ``(h, w, 3)`` uint8 (the model's input around the token, the feature's map
    blended in orange, the token outlined), its ``activation`` and a ``title``."""

    image: np.ndarray
    activation: float
    title: str


def _blend(rgb: np.ndarray, heat: np.ndarray, peak: float) -> np.ndarray:
    alpha = 0.65 * np.clip(heat / peak, 0.0, 1.0)[..., None] if peak > 0 else np.zeros((*heat.shape, 1))
    colour = np.array([255.0, 127.0, 14.0])
    return (rgb.astype(np.float64) * (1 - alpha) + colour * alpha).round().astype(np.uint8)


def example_crops(sae: SparseAutoencoder, loaded, index, feature: int, *, context: int = 2) -> tuple[list, list]:
    """The feature's top examples of ``index`` (a :class:`~vitviz.sae.index.FeatureIndex` of ``sae``) as
    :class:`Crop` s: the model's input (resized as it saw it) within ``context`` patches of the token, with the
    feature's map over it (one batched forward of the examples' images at the index's input size, through the
    registry). Returns (crops, notes): images that cannot be read any more are left out with a note."""
    from PIL import Image

    from vitviz.capture.forward import preprocess
    from vitviz.errors import VitvizError
    from vitviz.evaluate.data import Item, load_item
    from vitviz.sae.activations import point_values

    entry = index.feature(feature)
    meta = index.meta
    hw = (int(meta["input_size"][0]), int(meta["input_size"][1]))
    gh, gw = int(meta["grid"][0]), int(meta["grid"][1])
    n_prefix = int(meta["prefix_tokens"])
    paths = list(dict.fromkeys(e.path for e in entry.examples))
    pics: dict[str, Image.Image] = {}
    notes = []
    for p in paths:
        try:
            pics[p] = load_item(Item(image_id=p, path=p))
        except VitvizError as exc:
            notes.append(f"{p}: {exc}")
    if not pics:
        return [], notes
    order = list(pics)
    x, _ = point_values(loaded, sae.cfg.point, [pics[p] for p in order], hw)
    with torch.no_grad():
        f = sae.encode(x.to(sae.W_enc.device))[..., feature].float().cpu().numpy()  # (B, T)
    _, resized = preprocess(loaded, [pics[p] for p in order], hw)
    h, w = hw
    crops = []
    peak = max(entry.max_activation, 1e-12)
    for e in entry.examples:
        if e.path not in pics:
            continue
        b = order.index(e.path)
        grid = f[b, n_prefix : n_prefix + gh * gw].reshape(gh, gw)
        rows = np.minimum((np.arange(h) * gh) // h, gh - 1)
        cols = np.minimum((np.arange(w) * gw) // w, gw - 1)
        heat = grid[rows][:, cols]
        img = _blend(resized[b], heat, peak)
        if e.row is None:  # a prefix token: the whole input
            crops.append(Crop(img, e.activation, f"{e.image_id}, token {e.token}: {e.activation:.3g}"))
            continue
        r0, r1 = max(e.row - context, 0), min(e.row + context + 1, gh)
        c0, c1 = max(e.col - context, 0), min(e.col + context + 1, gw)
        y0, y1, x0, x1 = r0 * h // gh, r1 * h // gh, c0 * w // gw, c1 * w // gw
        ty0, ty1 = e.row * h // gh, (e.row + 1) * h // gh - 1
        tx0, tx1 = e.col * w // gw, (e.col + 1) * w // gw - 1
        img = img.copy()
        white = np.array([255, 255, 255], np.uint8)
        img[ty0, tx0 : tx1 + 1] = img[ty1, tx0 : tx1 + 1] = white
        img[ty0 : ty1 + 1, tx0] = img[ty0 : ty1 + 1, tx1] = white
        crops.append(Crop(img[y0:y1, x0:x1], e.activation, f"{e.image_id} ({e.row}, {e.col}): {e.activation:.3g}"))
    return crops, notes
