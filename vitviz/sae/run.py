"""An SAE's features on an image's Run, edits of them in the Run's forward, and their attribution to a target.

* :func:`features`: the feature activations ``(T, d_sae)`` of every token at the SAE's point, read from the
  clean Run (``run.activation(point)``; no forward of its own), with each token's strongest features and a
  feature's map over the point's patch grid (prefix tokens first, then the grid in row-major order; a
  hierarchical family's point lies on its own stage's grid).
* :func:`feature_edit`: clamp, scale or zero features as ONE registry edit, ``Edit(point, "fn", f)``, with the
  SAE's error term kept: ``f(x) = decode(edited(encode(x))) + (x - decode(encode(x)))``, computed as
  ``x + (decode(edited(f)) - decode(f))`` = ``x + (f' - f) W_dec`` (times the normalisation's scale), which is
  the same number mathematically and exactly ``x`` when nothing changes (no rounding of ``x - x_hat`` and back):
  an edit that changes nothing reproduces the clean run bit for bit, and only the edited features change what
  follows. :func:`edited` runs it through ``run.edited`` so every view reads the edited scores and records.
* :func:`attribution`: each feature's first-order effect on a target, ``f_i * d target / d f_i`` summed over the
  tokens in scope (one backward through the Run's graph to the point, then through the decoder), and the exact
  effect of zeroing each of the strongest few (the error term kept; copies of the image in one batched edited
  forward), with the rank correlation of the two.

Tokens in scope: an SAE trained on patch tokens only (``tokens = "patches"``) is edited, spliced and attributed on
the patch tokens (prefix tokens keep their values); one trained on every token, or of unknown training, on all.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch

from vitviz.capture.run import Edited, Run
from vitviz.capture.targets import Target, resolve_target
from vitviz.models.points import Edit
from vitviz.sae.model import SAEError, SparseAutoencoder

__all__ = [
    "Features",
    "FeatureEdit",
    "Attribution",
    "token_grid",
    "scope_tokens",
    "check_fits",
    "features",
    "feature_edit",
    "reconstruction_edit",
    "edited",
    "attribution",
    "DEFAULT_TOP",
]

DEFAULT_TOP = 32  # features per token listed when the SAE is not TopK (a TopK SAE lists its own k)
EditOp = Literal["clamp", "scale", "zero"]


def token_grid(run: Run, point: str) -> tuple[int, tuple[int, int]]:
    """(prefix tokens, patch grid ``(gh, gw)``) of the tokens at ``point``: the grid of the point's block (a
    hierarchical family's own stage). Raises :class:`SAEError` where the point's tokens are not that layout."""
    p = run.points.by_name.get(point)
    if p is None:
        raise SAEError(f"'{run.loaded.name}' has no point {point!r}")
    if p.kind == "pattern":
        raise SAEError(f"{point} holds attention probabilities, not tokens: an SAE reads a token point")
    site = 0 if p.site is None else p.site
    pos = next(i for i, s in enumerate(run.sites) if s.index == site)
    g = run.geometries[pos]
    x = run.activation(point)
    n_prefix, (gh, gw) = len(g.prefix_kinds), g.grid
    if g.unroll or x.dim() != 3 or x.shape[0] != 1 or x.shape[1] != n_prefix + gh * gw + g.trailing:
        raise SAEError(
            f"the value at {point} (shape {tuple(x.shape)}) is not one row per token of its block's "
            f"{n_prefix} prefix tokens and {gh} x {gw} grid in row-major order: features are not mapped there"
        )
    return n_prefix, (gh, gw)


def scope_tokens(sae: SparseAutoencoder, run: Run) -> tuple[int, ...] | None:
    """The token indices edits and splices change (module docstring): the patch tokens for a patches-only SAE,
    None (every token) otherwise."""
    if sae.cfg.tokens != "patches":
        return None
    n_prefix, (gh, gw) = token_grid(run, _point(sae))
    return tuple(range(n_prefix, n_prefix + gh * gw))


def _point(sae: SparseAutoencoder) -> str:
    if sae.cfg.point is None:
        raise SAEError("this SAE does not say which point it reads: load it with point=... (e.g. blocks.2.out)")
    return sae.cfg.point


def check_fits(sae: SparseAutoencoder, run: Run) -> None:
    """Raise :class:`SAEError` unless the run's model has the SAE's point with the SAE's width."""
    point = _point(sae)
    if point not in run.points:
        from vitviz.sae.load import check_point

        check_point(sae, run.loaded)
    x = run.activation(point)
    if x.shape[-1] != sae.d_in:
        raise SAEError(
            f"the SAE reads {sae.d_in}-wide activations at {point}; '{run.loaded.name}' has {x.shape[-1]} there: "
            "it was trained on another model"
        )


@dataclass(frozen=True)
class Features:
    """One image's features at one point: ``values`` ``(T, d_sae)`` float32 (every token, in the point's order),
    ``n_prefix`` prefix tokens before the ``grid`` ``(gh, gw)``; ``k``: features listed per token."""

    point: str
    values: torch.Tensor
    n_prefix: int
    grid: tuple[int, int]
    k: int

    @property
    def num_tokens(self) -> int:
        return int(self.values.shape[0])

    def top(self, k: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Each token's ``k`` strongest features, largest first: ids ``(T, k)`` int32, values ``(T, k)`` float32
        (ties: the lower id first)."""
        k = self.k if k is None else k
        k = min(k, self.values.shape[1])
        # A stable sort on the negated values: equal activations (zeros) keep id order, so the lists are reproducible.
        order = torch.argsort(-self.values, dim=-1, stable=True)[:, :k]
        vals = torch.gather(self.values, 1, order)
        return order.numpy().astype(np.int32), vals.numpy().astype(np.float32)

    def token_top(self, token: int, k: int | None = None) -> list[tuple[int, float]]:
        """The ``k`` strongest features of one token, active ones only: ``[(feature, activation), ...]``."""
        ids, vals = self.top(k)
        return [(int(i), float(v)) for i, v in zip(ids[token], vals[token], strict=True) if v > 0]

    def map(self, feature: int) -> np.ndarray:
        """Feature ``feature``'s activation on each patch, ``(gh, gw)`` float32 (prefix tokens left out)."""
        if not 0 <= feature < self.values.shape[1]:
            raise SAEError(f"feature {feature} is outside 0..{self.values.shape[1] - 1}")
        gh, gw = self.grid
        col = self.values[self.n_prefix : self.n_prefix + gh * gw, feature]
        return col.reshape(gh, gw).numpy().astype(np.float32)

    def maps(self, feature_ids: Sequence[int]) -> np.ndarray:
        """``(F, gh, gw)`` float32: :meth:`map` of each feature."""
        gh, gw = self.grid
        if not len(feature_ids):
            return np.zeros((0, gh, gw), np.float32)
        return np.stack([self.map(int(i)) for i in feature_ids])

    def frequency(self) -> np.ndarray:
        """``(d_sae,)``: the share of this image's tokens on which each feature is active."""
        return (self.values > 0).float().mean(dim=0).numpy()


def features(run: Run, sae: SparseAutoencoder) -> Features:
    """The SAE's features of every token of ``run``'s image at the SAE's point (no forward: the clean run's
    value). Prefix tokens are encoded too (a patches-only SAE never saw them: read their features with care)."""
    check_fits(sae, run)
    point = _point(sae)
    n_prefix, grid = token_grid(run, point)
    x = run.activation(point)[0].float()
    with torch.no_grad():
        values = sae.encode(x).float().contiguous()
    k = sae.cfg.k if sae.cfg.activation == "topk" and sae.cfg.k else DEFAULT_TOP
    return Features(point, values, n_prefix, grid, int(k))


@dataclass(frozen=True)
class FeatureEdit:
    """One change of one feature: ``clamp`` (set to ``value``), ``scale`` (times ``value``) or ``zero``, on
    ``tokens`` (indices of the point's tokens; None: every token in the SAE's scope)."""

    feature: int
    op: EditOp = "zero"
    value: float = 0.0
    tokens: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if self.op not in ("clamp", "scale", "zero"):
            raise SAEError(f"a feature edit is clamp, scale or zero, got {self.op!r}")
        if not np.isfinite(self.value):
            raise SAEError(f"a feature edit's value must be finite, got {self.value}")
        if self.tokens is not None:
            object.__setattr__(self, "tokens", tuple(int(t) for t in self.tokens))


def _token_mask(n: int, tokens: Sequence[int] | None, scope: Sequence[int] | None, device) -> torch.Tensor:
    """``(n, 1)`` bool: the tokens an edit changes (its own selection within the SAE's scope)."""
    m = torch.ones(n, dtype=torch.bool, device=device)
    if scope is not None:
        m = torch.zeros(n, dtype=torch.bool, device=device)
        m[list(scope)] = True
    if tokens is not None:
        bad = [t for t in tokens if not -n <= t < n]
        if bad:
            raise SAEError(f"tokens {bad} outside 0..{n - 1}")
        sel = torch.zeros(n, dtype=torch.bool, device=device)
        sel[list(tokens)] = True
        m = m & sel
    return m[:, None]


def _apply(f: torch.Tensor, edits: Sequence[FeatureEdit], scope: Sequence[int] | None) -> torch.Tensor:
    """``f`` ``(n, T, d_sae)`` with ``edits`` applied in order (a new tensor)."""
    out = f.clone()
    d_sae = f.shape[-1]
    for e in edits:
        if not 0 <= e.feature < d_sae:
            raise SAEError(f"feature {e.feature} is outside 0..{d_sae - 1}")
        m = _token_mask(f.shape[1], e.tokens, scope, f.device)[None, :, 0]  # (1, T)
        col = out[..., e.feature]
        new = {"clamp": torch.full_like(col, e.value), "scale": col * e.value, "zero": torch.zeros_like(col)}[e.op]
        out[..., e.feature] = torch.where(m, new, col)
    return out


def _delta(sae: SparseAutoencoder, f_new: torch.Tensor, f: torch.Tensor, stats) -> torch.Tensor:
    """``decode(f_new) - decode(f)`` for the same input: ``(f_new - f) W_dec``, times the normalisation's scale."""
    d = (f_new - f) @ sae.W_dec
    return d if stats is None else d * stats[1]


def _edit_fn(
    sae: SparseAutoencoder, per_copy: Sequence[Sequence[FeatureEdit]], scope: Sequence[int] | None
) -> Callable[[torch.Tensor], torch.Tensor]:
    """The function an ``fn`` edit applies to the point's value ``(k * n, T, d)``: copy j gets ``per_copy[j]``."""
    k = len(per_copy)

    def fn(x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] % k:
            raise SAEError(f"{x.shape[0]} rows do not split into {k} copies")
        xf = x.float()
        f, stats = sae.encode_with_stats(xf)
        n = x.shape[0] // k
        f_new = torch.cat([_apply(f[j * n : (j + 1) * n], per_copy[j], scope) for j in range(k)])
        return (xf + _delta(sae, f_new, f, stats)).to(x.dtype)

    return fn


def feature_edit(sae: SparseAutoencoder, edits: Sequence[FeatureEdit], *, scope: Sequence[int] | None = None) -> Edit:
    """ONE registry edit at the SAE's point applying ``edits`` with the error term kept (module docstring).
    ``scope``: the tokens it may change (:func:`scope_tokens`; None: every token)."""
    return Edit(_point(sae), "fn", _edit_fn(sae, [list(edits)], scope))


def reconstruction_edit(sae: SparseAutoencoder, *, scope: Sequence[int] | None = None) -> Edit:
    """The splice: the point replaced by the SAE's reconstruction ``decode(encode(x))`` on the tokens of
    ``scope`` (None: every token), the error term dropped."""
    point = _point(sae)

    def fn(x: torch.Tensor) -> torch.Tensor:
        x_hat = sae(x.float()).to(x.dtype)
        if scope is None:
            return x_hat
        m = _token_mask(x.shape[1], None, scope, x.device)[None]  # (1, T, 1)
        return torch.where(m, x_hat, x)

    return Edit(point, "fn", fn)


def edited(
    run: Run,
    sae: SparseAutoencoder,
    edits: Sequence[FeatureEdit],
    *,
    record: Sequence[str] = (),
) -> Edited:
    """The run with ``edits`` of the SAE's features (error term kept): its scores ``(1, C)`` and the values at
    ``record`` (the SAE's point is always recorded: the edited value there), from ``run.edited``."""
    check_fits(sae, run)
    point = _point(sae)
    edit = feature_edit(sae, edits, scope=scope_tokens(sae, run))
    return run.edited([edit], record=list(dict.fromkeys([point, *record])))


@dataclass(frozen=True)
class Attribution:
    """Features' effects on a target. ``estimate`` ``(d_sae,)``: ``sum_t f_i(t) * d target / d f_i(t)`` over the
    tokens in scope (first order; what removing feature i would change, with the sign of its contribution);
    ``per_token`` ``(T, d_sae)`` its terms; ``exact_ids`` the features ablated exactly (largest ``|estimate|``
    first), ``exact`` ``target(clean) - target(feature zeroed)`` for each; ``rank_correlation``: Spearman's rho of
    ``estimate[exact_ids]`` and ``exact`` (NaN with fewer than 2 or a constant side); ``target`` what was
    explained; ``clean`` its clean value."""

    target: Target
    clean: float
    estimate: np.ndarray
    per_token: np.ndarray
    exact_ids: np.ndarray
    exact: np.ndarray
    rank_correlation: float


def attribution(
    run: Run,
    sae: SparseAutoencoder,
    target: Target | int | None = None,
    *,
    exact_top: int = 8,
) -> Attribution:
    """Each feature's attribution to ``target`` (a :class:`~vitviz.capture.targets.Target`, a class index, or
    None: the predicted class): the first-order estimate for every feature by one backward through the Run's
    graph, and the exact effect of zeroing each of the ``exact_top`` largest (one batched edited forward)."""
    from vitviz.analysis.first_order import rank_correlation

    check_fits(sae, run)
    if run.scores.numel() == 0:
        raise SAEError(f"'{run.loaded.name}' gives no scores to attribute (a backbone, or labels missing)")
    tgt = resolve_target(target, predicted=lambda: int(torch.argmax(run.scores)))
    if tgt.index >= run.scores.numel() or (tgt.minus is not None and tgt.minus >= run.scores.numel()):
        raise SAEError(f"target {tgt.name(run.loaded.id2label)} is outside the run's {run.scores.numel()} scores")
    point = _point(sae)
    scope = scope_tokens(sae, run)
    (grad,) = run.gradients(lambda out: tgt.select(run.score_of(out)).sum(), [point])
    if grad is None:
        raise SAEError(f"the target does not depend on {point}")
    x = run.activation(point)[0].float()  # (T, d)
    g = grad[0].float()  # (T, d)
    with torch.no_grad():
        f, stats = sae.encode_with_stats(x)
        scale = 1.0 if stats is None else stats[1]
        per_token = f * ((g * scale) @ sae.W_dec.T)  # d x / d f_i = W_dec[i] (times the scale): (T, d_sae)
        if scope is not None:
            keep = _token_mask(x.shape[0], None, scope, x.device)
            per_token = torch.where(keep, per_token, torch.zeros_like(per_token))
    estimate = per_token.sum(dim=0).numpy().astype(np.float64)
    clean = float(tgt.select(run.scores))
    m = int(min(max(exact_top, 0), int((estimate != 0).sum())))
    ids = np.argsort(-np.abs(estimate), kind="stable")[:m]
    exact = np.zeros(0)
    if m:
        fn = _edit_fn(sae, [[FeatureEdit(int(i), "zero")] for i in ids], scope)
        got = run.edited([Edit(point, "fn", fn)], batch=m)
        exact = clean - tgt.select(got.scores.numpy()).astype(np.float64)
    rho = rank_correlation(estimate[ids], exact) if m >= 2 else float("nan")
    return Attribution(tgt, clean, estimate, per_token.numpy(), ids.astype(np.int64), exact, rho)
