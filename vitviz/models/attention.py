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

Memory: the scores are scaled and masked in place, and a call that only reads the
probabilities at the block's end (a capture: no graph, no record or edit of the pattern)
may lend a buffer that every block's scores and probabilities are written into. On the
CPU a fresh ``(B, H, T, T)`` tensor is fresh pages from the system, and touching them
cost more than the arithmetic (DINOv2-base at 518 px: 134 ms a block with two fresh
tensors, 76 ms in one lent buffer, the same numbers bit for bit).
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
# The registry's lender of a buffer for a block's probabilities (vitviz.models.hooks.scratch_for), or None.
_lender: Callable[[nn.Module, torch.Size, torch.dtype, torch.device], torch.Tensor | None] | None = None


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
    lent = None
    if _lender is not None and query.dtype == torch.float32 and not (dropout and module.training):
        batch = torch.broadcast_shapes(query.shape[:-2], key.shape[:-2])
        lent = _lender(module, torch.Size((*batch, query.shape[-2], key.shape[-2])), query.dtype, query.device)
    # In place: the matmul's backward reads its inputs, not its output, so scaling and masking it in place is safe.
    weights = torch.matmul(query, key.transpose(-1, -2), out=lent).mul_(scaling)
    if attention_mask is not None:
        weights.add_(attention_mask[:, :, :, : key.shape[-2]])
    if lent is not None:
        weights = torch.softmax(weights, dim=-1, out=weights)  # float32 already: the same numbers as below
    else:
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
    callers: Iterable[nn.Module],
    visitor: Callable[[nn.Module, torch.Tensor], torch.Tensor],
    lender: Callable[[nn.Module, torch.Size, torch.dtype, torch.device], torch.Tensor | None] | None = None,
) -> None:
    """Make the attention modules ``callers`` (those whose pattern is a point) run :func:`attention_forward`, which
    hands each block's probabilities to ``visitor`` (the registry's); their configs name vitviz's implementation (a
    two-tower model's text tower keeps its own). At load only, before other threads run the model."""
    global _visitor, _lender
    _register()
    _visitor, _lender = visitor, lender
    for module in callers:
        config = module.__dict__.get("config")  # the registry declares only callers that read one
        config._attn_implementation = IMPLEMENTATION  # the private field: set_attn_implementation refuses custom names
