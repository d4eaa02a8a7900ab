"""Class-specific relevance (Chefer, Gur & Wolf 2021, "Generic Attention-model Explainability").

``R = I``; for l = 1..L: ``Abar_l = mean_h(clamp(G_l * A_l, min=0))``, ``R = R + Abar_l @ R``,
where ``G_l = d y_c / d A_l`` is the gradient of the class logit (before softmax)
with respect to layer l's own attention. The map is ``R[0, P:]``; no row
normalisation.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from PIL import Image

from vitviz.capture.run import DEFAULT_BUDGET_BYTES, check_budget, forward, input_size_for, preprocess, token_layout
from vitviz.errors import CaptureError
from vitviz.models.load import LoadedModel

__all__ = ["chefer_relevance", "Explanation", "explain_classes"]


def chefer_relevance(attn: np.ndarray, grads: np.ndarray) -> np.ndarray:
    """Relevance matrix from attention and its gradients: ``(L, H, T, T) x 2 -> (T, T)`` float64.

    ``grads[l]`` must be the gradient with respect to ``attn[l]`` (same layer).
    """
    if attn.shape != grads.shape:
        raise ValueError(f"attention {attn.shape} and gradients {grads.shape} differ in shape")
    t = attn.shape[-1]
    r = np.eye(t)
    for a, g in zip(attn, grads, strict=True):
        abar = np.clip(g.astype(np.float64) * a.astype(np.float64), 0.0, None).mean(axis=0)
        r = r + abar @ r
    return r


@dataclass(frozen=True, eq=False)
class Explanation:
    """Relevance of every token for one class: ``relevance`` (T,) is row 0 (CLS) of ``R``."""

    class_index: int
    label: str
    relevance: np.ndarray = field(repr=False)
    num_prefix_tokens: int
    grid: tuple[int, int]

    def patch_map(self) -> np.ndarray:
        """``(gh, gw)`` relevance of the patches, raw (not normalised)."""
        return self.relevance[self.num_prefix_tokens :].reshape(self.grid)


def explain_classes(
    loaded: LoadedModel,
    image: Image.Image,
    classes: Sequence[int],
    *,
    size: int | tuple[int, int] | None = None,
    budget_bytes: int = DEFAULT_BUDGET_BYTES,
) -> dict[int, Explanation]:
    """One forward pass with gradients, one backward pass per class.

    Gradients flow to the input only (the shared model's parameters never
    require grad and no ``.grad`` is written), so concurrent calls do not interact.
    """
    if not loaded.has_classifier:
        raise CaptureError(
            f"'{loaded.name}' is a backbone without a classifier: class-specific relevance needs class logits."
        )
    n_classes = len(loaded.id2label)
    bad = [c for c in classes if not 0 <= int(c) < n_classes]
    if bad:
        raise ValueError(f"class indices {bad} are outside 0..{n_classes - 1}")
    hw = input_size_for(loaded, size)
    check_budget(loaded, hw, batch=1, gradients=True, budget=budget_bytes)
    pixels, _ = preprocess(loaded, [image], hw)
    pixels.requires_grad_(True)
    prefix_kinds, grid = token_layout(loaded, hw)
    prefix = len(prefix_kinds)
    result: dict[int, Explanation] = {}
    with torch.enable_grad():
        out = forward(loaded, pixels)
        attn = np.stack([a[0].detach().float().cpu().numpy() for a in out.attentions])
        for i, c in enumerate(classes):
            grads = torch.autograd.grad(out.logits[0, int(c)], out.attentions, retain_graph=i < len(classes) - 1)
            g = np.stack([x[0].float().cpu().numpy() for x in grads])
            rel = chefer_relevance(attn, g)[0].astype(np.float32)
            rel.setflags(write=False)
            result[int(c)] = Explanation(int(c), loaded.id2label[int(c)], rel, prefix, grid)
    return result
