"""vitviz's attention function: ``transformers``' eager attention with the probabilities as a named point.

Families whose attention modules call ``transformers``' attention interface (ViT, DeiT,
DINOv2, BEiT, Swin, CLIP, SigLIP, DINOv3, MAE, I-JEPA, AIMv2, MSN) run this function
instead of ``eager_attention_forward`` once vitviz has loaded them
(:func:`use_vitviz_attention`). Outside a vitviz call it computes exactly what eager
attention computes (scores ``q k^T * scaling + mask``, softmax, dropout, ``A v``) and
returns the probabilities as eager does, so every capture keeps reading them; inside a
call that records or edits ``blocks.{i}.attn.pattern`` (:mod:`vitviz.models.hooks`), the
probabilities pass through the call's edits before they are multiplied with the values,
and the output and the returned probabilities are what the edited forward used.

The softmax runs in float32 and is cast back to the query's dtype (as most of these
families' own eager functions do; for DINOv2's, which stays in the input dtype, the two
are the same numbers in float32 and at least as accurate in half precision).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
from torch import nn

__all__ = ["IMPLEMENTATION", "attention_forward", "use_vitviz_attention"]

IMPLEMENTATION = "vitviz"
_registered = False
# The registry's pattern visitor (vitviz.models.hooks.visit_pattern), set when a model is installed: this module
# imports nothing of the registry, which imports it.
_visitor: Callable[[nn.Module, torch.Tensor], torch.Tensor] | None = None


def attention_forward(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Eager attention ``(B, H, T, d)`` x3 -> output ``(B, T, H, d)`` and probabilities ``(B, H, Tq, Tk)``."""
    if scaling is None:
        scaling = query.size(-1) ** -0.5
    weights = torch.matmul(query, key.transpose(-1, -2)) * scaling
    if attention_mask is not None:
        weights = weights + attention_mask[:, :, :, : key.shape[-2]]
    weights = nn.functional.softmax(weights, dim=-1, dtype=torch.float32).to(query.dtype)
    weights = nn.functional.dropout(weights, p=dropout, training=module.training)
    if _visitor is not None:
        weights = _visitor(module, weights)  # the call's records and edits of this block's pattern
    out = torch.matmul(weights, value)
    return out.transpose(1, 2).contiguous(), weights


def _register() -> None:
    global _registered
    if _registered:
        return
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, eager_mask

    AttentionInterface.register(IMPLEMENTATION, attention_forward)
    # Masks (SigLIP 2's padding, a text tower's causal mask) are built as for eager attention: transformers drops
    # the mask of an implementation it has no mask function for.
    AttentionMaskInterface.register(IMPLEMENTATION, eager_mask)
    _registered = True


def use_vitviz_attention(
    callers: Iterable[nn.Module], visitor: Callable[[nn.Module, torch.Tensor], torch.Tensor]
) -> None:
    """Make the attention modules ``callers`` (those whose pattern is a point) run :func:`attention_forward`, which
    hands each block's probabilities to ``visitor`` (the registry's); their configs name vitviz's implementation (a
    two-tower model's text tower keeps its own). At load only, before other threads run the model."""
    global _visitor
    _register()
    _visitor = visitor
    for module in callers:
        config = module.__dict__.get("config")  # the registry declares only callers that read one
        config._attn_implementation = IMPLEMENTATION  # the private field: set_attn_implementation refuses custom names
