"""Prompt-word relevance: which tokens of a label's prompt its image-text score rests on (CLIP, SigLIP).

The text-side rule of Chefer, Gur & Wolf 2021 ("Generic Attention-model
Explainability", MM-Explainability's CLIP notebook), on the text tower's own
attention: ``y`` the label's score as the model computes ``logits_per_image``
(``logit_scale.exp() * cos(image, text)``, + ``logit_bias`` for SigLIP),
``G_l = dy / dA_l`` from one backward pass, ``R = I`` ``(T, T)``;
``R = R + mean_h(clamp(G_l * A_l, min=0)) @ R`` for l = k..L-1 (k = ``start_block``,
0 by default: all blocks). The relevance of each token is the row of ``R`` at the
token the text tower pools:

* CLIP: the end-of-text token (``CLIPTextTransformer``: the first ``eos_token_id``, or
  the highest id where the config's ``eos_token_id`` is the legacy 2);
* SigLIP: the last position (the tower reads ``last_hidden_state[:, -1]``), which is
  padding for a short prompt: SigLIP attends over the padding it was trained with.

The row is kept over the prompt's tokens (padding left out), raw (not normalised),
tokens as the tokenizer cut them (``convert_ids_to_tokens``, special tokens included).

Hooks: :func:`install_text_hooks` registers, once per model (at load, before the
model is shared), a forward hook on each text attention module and one on the
text embeddings; they act only inside :func:`prompt_relevance`'s call (a
``ContextVar``), so other threads' forwards are never recorded.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from vitviz.models.text_hooks import _ACTIVE, install_text_hooks
from vitviz.models.zeroshot import Labels, TextTower, ZeroShotError, _scale_bias

__all__ = ["PromptRelevance", "install_text_hooks", "pooled_position", "prompt_relevance", "token_table"]


def pooled_position(model: torch.nn.Module, input_ids: torch.Tensor) -> int:
    """The position the text tower pools for one sequence ``(T,)`` (module docstring)."""
    if hasattr(model, "logit_bias"):  # SigLIP: the last position
        return int(input_ids.shape[-1]) - 1
    eos = getattr(model.text_model, "eos_token_id", None)
    if eos is None:
        eos = model.config.text_config.eos_token_id
    ids = input_ids.to(torch.int)
    if eos == 2:
        return int(ids.argmax())
    hits = torch.nonzero(ids == int(eos)).flatten()
    return int(hits[0]) if len(hits) else int(ids.argmax())


@dataclass(frozen=True, eq=False)
class PromptRelevance:
    """One label's prompt: its ``tokens`` as cut by the tokenizer and their ``relevance`` ``(n,)`` float32, raw.

    ``pooled``: the index in ``tokens`` of the token the tower pools, or None where it
    is padding (SigLIP). ``start_block``: the first text block the relevance ran through.
    """

    label: str
    prompt: str
    tokens: tuple[str, ...]
    relevance: np.ndarray = field(repr=False)
    pooled: int | None
    start_block: int = 0


def prompt_relevance(
    model: torch.nn.Module,
    tower: TextTower,
    image_embedding: np.ndarray,
    labels: Labels,
    *,
    start_block: int = 0,
) -> tuple[PromptRelevance, ...]:
    """Relevance of each prompt token for each label's score against one image embedding ``(D,)``.

    One forward and one backward pass through the text tower per label. ``start_block``:
    the first text block (``-n..n-1``; -1 the last, MM-Explainability's notebook default).
    """
    n = install_text_hooks(model)
    if n == 0:
        raise ZeroShotError("This model has no text tower whose attention vitviz can read.")
    if not -n <= int(start_block) < n:
        raise ZeroShotError(
            f"Prompt relevance from block {start_block}: the text tower has {n} blocks, numbered 0..{n - 1} "
            "(or -1 for the last block)."
        )
    first = int(start_block) % n
    scale, bias = _scale_bias(model)
    device = next(model.parameters()).device
    img = torch.tensor(np.asarray(image_embedding, np.float32), device=device)
    img = img / img.norm()
    out = []
    for name, prompt in zip(labels.names, labels.prompts, strict=True):
        enc = tower.tokenizer(
            [prompt], padding=tower.padding, truncation=True, max_length=tower.max_length, return_tensors="pt"
        )
        ids = enc["input_ids"].to(device)
        kwargs = {"input_ids": ids}
        if tower.padding != "max_length" and "attention_mask" in enc:
            kwargs["attention_mask"] = enc["attention_mask"].to(device)
        real = len(tower.tokenizer(prompt, truncation=True, max_length=tower.max_length)["input_ids"])  # no padding
        recorded: list[torch.Tensor] = []
        token = _ACTIVE.set(recorded)
        try:
            with torch.enable_grad():
                feats = model.get_text_features(**kwargs)
                feats = getattr(feats, "pooler_output", feats)[0]
                y = scale * (feats / feats.norm()) @ img.to(feats.dtype) + bias
                if any(a is None for a in recorded):
                    grads = ()
                else:
                    grads = torch.autograd.grad(y, recorded, allow_unused=True)
        finally:
            _ACTIVE.reset(token)
        if len(recorded) != n or any(a is None for a in recorded):
            raise RuntimeError(
                f"recorded {len(recorded)} text blocks' attention, expected {n}: the text tower must run eager "
                "attention (load the model with attn_implementation='eager', as load_model does)"
            )
        t = ids.shape[1]
        r = np.eye(t)
        for layer, (a, g) in enumerate(zip(recorded, grads, strict=True)):
            if layer < first or g is None:
                continue
            cam = (g[0].double() * a[0].detach().double()).clamp(min=0).mean(0).cpu().numpy()
            r = r + cam @ r
        pooled = pooled_position(model, ids[0])
        row = r[pooled, :real].astype(np.float32)
        row.setflags(write=False)
        tokens = tuple(tower.tokenizer.convert_ids_to_tokens(ids[0, :real].tolist()))
        out.append(PromptRelevance(name, prompt, tokens, row, pooled if pooled < real else None, first))
    return tuple(out)


def token_table(rows: tuple[PromptRelevance, ...]) -> tuple[np.ndarray, np.ndarray]:
    """``label_tokens`` ``(K, T)`` str ("" past a prompt's end) and ``label_token_relevance`` ``(K, T)`` float32 (NaN)."""
    width = max((len(r.tokens) for r in rows), default=0)
    tokens = np.full((len(rows), width), "", dtype=object)
    rel = np.full((len(rows), width), np.nan, dtype=np.float32)
    for i, r in enumerate(rows):
        tokens[i, : len(r.tokens)] = r.tokens
        rel[i, : len(r.tokens)] = r.relevance
    return tokens.astype(str), rel
