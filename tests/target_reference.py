"""Chefer et al.'s relevance of a difference of two logits, by hand from a Hugging Face ViT's own attentions.

Written without vitviz's relevance code: the model's ``output_attentions`` (eager attention: the very
probabilities multiplied with the values), one backward of the scalar ``logit[a] - logit[b]``, then
``R = I; R += mean_h(clamp(G_l * A_l, 0)) @ R`` for blocks ``start..L-1``; the CLS row over the patches.
"""

from __future__ import annotations

import numpy as np
import torch


def relevance_by_hand(model, pixels: torch.Tensor, a: int, b: int | None, grid: tuple[int, int], start: int = 0):
    """``(gh, gw)`` float64 relevance of ``logit[a] - logit[b]`` (``b`` None: ``logit[a]``) for ``pixels`` (1, 3, h, w)."""
    with torch.enable_grad():
        p = pixels.detach().clone().requires_grad_(True)
        out = model(pixel_values=p, output_attentions=True)
        y = out.logits[0, a] - (out.logits[0, b] if b is not None else 0.0)
        grads = torch.autograd.grad(y, out.attentions)
    t = out.attentions[0].shape[-1]
    r = np.eye(t)
    for layer, (att, g) in enumerate(zip(out.attentions, grads, strict=True)):
        if layer < start:
            continue
        abar = (g * att).clamp(min=0).mean(dim=1)[0].detach().double().numpy()
        r = r + abar @ r
    return r[0, 1:].reshape(grid)


def clip_relevance_by_hand(clip, pixels: torch.Tensor, prompts, a: int, b: int | None, grid: tuple[int, int]):
    """``(gh, gw)`` float64 relevance of label ``a``'s image-text score minus label ``b``'s (``b`` None: ``a``'s
    alone) for a CLIP (``clip``: a loaded model with its ``text`` tokenizer), from its own vision attentions."""
    tok = clip.text.tokenizer(list(prompts), padding=True, return_tensors="pt")
    with torch.enable_grad():
        p = pixels.detach().clone().requires_grad_(True)
        out = clip.model(**tok, pixel_values=p, output_attentions=True)
        att = out.vision_model_output.attentions
        s = out.logits_per_image[0]
        grads = torch.autograd.grad(s[a] - (s[b] if b is not None else 0.0), att)
    r = np.eye(att[0].shape[-1])
    for x, g in zip(att, grads, strict=True):
        r = r + (g * x).clamp(min=0).mean(dim=1)[0].detach().double().numpy() @ r
    return r[0, 1:].reshape(grid)
