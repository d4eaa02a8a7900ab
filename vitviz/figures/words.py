"""Prompt tokens coloured by their relevance, as HTML that shows every token as plain text (escaped)."""

from __future__ import annotations

import html
from collections.abc import Sequence

import numpy as np

__all__ = ["token_relevance_html", "token_alphas"]


def token_alphas(relevance: Sequence[float]) -> np.ndarray:
    """Opacity per token ``(n,)`` in [0, 1]: relevance divided by the prompt's largest (all 0 when none is > 0)."""
    r = np.clip(np.nan_to_num(np.asarray(relevance, np.float64)), 0.0, None)
    top = r.max() if r.size else 0.0
    return r / top if top > 0 else np.zeros_like(r)


def token_relevance_html(
    tokens: Sequence[str], relevance: Sequence[float], *, rgb: tuple[int, int, int] = (230, 97, 0)
) -> str:
    """One ``<span>`` per token, its background ``rgb`` at :func:`token_alphas` opacity, its raw value as a tooltip.

    Tokens are escaped (``<bos>`` shows as typed; a label holding markup stays text).
    """
    if len(tokens) != len(relevance):
        raise ValueError(f"{len(tokens)} tokens and {len(relevance)} relevance values")
    spans = []
    for tok, a, v in zip(tokens, token_alphas(relevance), relevance, strict=True):
        spans.append(
            f'<span title="{html.escape(f"{float(v):.4g}")}" style="background: rgba({rgb[0]}, {rgb[1]}, {rgb[2]}, '
            f'{a:.3f}); padding: 1px 3px; margin: 1px; border-radius: 3px; font-family: monospace">'
            f"{html.escape(str(tok))}</span>"
        )
    return '<div style="line-height: 2">' + " ".join(spans) + "</div>"
