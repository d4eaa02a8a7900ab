"""Direct logit attribution (one-grid ViTs with a linear readout).

Freeze the final LayerNorm's scale ``sigma_r = sqrt(var(v_r) + eps)`` at its clean value
for each vector the head reads (``v = select(x_L)``: CLS; CLS and DIST; every token for
DINOv2's CLS + mean-patch head; the mean patch token for BEiT). The norm is then affine in
the residual stream, and the pre-norm residual stream is a sum: ``x_L = embeddings +
sum_l (s1_l * (z_l W_o^T + b_o) + s2_l * mlp_l)`` (``s1``, ``s2``: layer scales where the
family has them, else 1). So the logit of c splits exactly into

* a term per head and block: ``head(norm_frozen(select(s1_l * z_{l,h} W_{o,h}^T)))``
  minus the head's value at zero (the head's slice through the output projection,
  without its bias ``b_O``; ``z_h`` includes the value bias ``b_V,h``, so the head's
  part does too, unlike ViT-Prisma's default, which folds it into ``b_O``);
* a term per MLP: the MLP's own output (point ``blocks.{l}.mlp.out``) times its layer
  scale, without the MLP's output bias;
* the rest: the embeddings, every bias (output projections, MLP outputs, the norm's
  shift, the classifier's bias).

Every part is computed from its own activations, so the sum equalling the logit is a
check that can fail (checked on every call, relative 1e-4): a layer scale, norm or branch
the adapter does not describe makes it fail, and the call refuses (:class:`NotDefined`)
instead of returning wrong parts. The layer scales and the MLP module are what the family's
block layout declares; where it cannot say, attribution refuses before computing
anything. Not defined for hierarchical models (patch merging mixes tokens and widths) and
for models whose readout is not an affine function of normalised tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
from PIL import Image

from vitviz.capture.forward import DEFAULT_BUDGET_BYTES
from vitviz.capture.run import Run
from vitviz.capture.targets import Target
from vitviz.causal.notes import (
    READOUT_RTOL,
    NotDefined,
    causal_notes,
    clean_run,
    projections,
    readout_of,
    z_name,
)
from vitviz.models.load import LoadedModel
from vitviz.record import frozen

__all__ = ["Attribution", "direct_logit_attribution", "attribution_of_run"]


@dataclass(frozen=True)
class Attribution:
    """Direct logit attribution of ``logit``, the value of ``target`` (class ``class_index``, minus another for a
    difference target): ``heads`` ``(L, H)`` + ``mlps`` ``(L,)`` + ``rest`` = ``logit`` (float64 parts; NaN for
    heads a block does not have). ``norm_scale`` ``(R,)``: the frozen LayerNorm scales of the vectors the head
    reads."""

    class_index: int
    logit: float
    heads: np.ndarray = field(repr=False)
    mlps: np.ndarray = field(repr=False)
    rest: float
    norm_scale: np.ndarray = field(repr=False)
    readout: str
    target: Target | None = None

    @property
    def total(self) -> float:
        return float(np.nansum(self.heads) + self.mlps.sum() + self.rest)


def attribution_of_run(run: Run, t: Target) -> Attribution:
    """``t``'s value (checked against the run: :meth:`~vitviz.capture.run.Run.target`) split into parts; the head's
    output passes through ``t`` in float64, so a difference target's parts are the differences of the parts."""
    loaded, fam = run.loaded, run.loaded.family
    notes = causal_notes(loaded)
    readout, problem = readout_of(run)
    if notes["attribution"] or readout is None or not run.replayable:
        raise NotDefined(
            notes["attribution"] or problem or f"Direct logit attribution is not defined for '{loaded.name}'."
        )
    projs = projections(run)
    parts = [fam.block_parts(site) for site in run.sites]
    for i, (site, p) in enumerate(zip(run.sites, parts, strict=True)):
        why = p.unknown
        if not why and (projs[i] is None or not run.has(run.name(site.index, "mlp.out"))):
            why = f"block {i} has no per-head projection or no MLP output point"
        if why:
            raise NotDefined(f"Direct logit attribution of '{loaded.name}' is refused: {why}.")
    norm = readout.norm
    if not isinstance(norm, torch.nn.LayerNorm):
        raise NotDefined(f"The final norm of '{loaded.name}' is a {type(norm).__name__}, not a LayerNorm.")
    n, width = run.num_blocks, max(run.num_heads)
    device, dtype = run.scores.device, run.scores.dtype

    def f64(t: torch.Tensor) -> torch.Tensor:  # float64 on the CPU (MPS has no float64)
        return t.detach().to("cpu", torch.float64)

    with torch.inference_mode():
        x_last = run.block_tokens(run.sites[-1].index)[1]
        v = readout.select(f64(x_last))  # (1, R, D)
        sigma = torch.sqrt(v.var(dim=-1, unbiased=False, keepdim=True) + norm.eps)  # frozen, (1, R, 1)
        dim = v.shape[-1]
        ones = torch.ones(dim, dtype=torch.float64)
        gamma = f64(norm.weight) if norm.weight is not None else ones
        beta = f64(norm.bias) if norm.bias is not None else torch.zeros_like(ones)

        def head(u: torch.Tensor) -> torch.Tensor:  # normed vectors (K, R, D) float64 -> target's value (K,) float64
            return t.select(f64(readout.head(u.to(device, dtype))))

        zero = head(torch.zeros_like(v))

        def part(resid: torch.Tensor) -> torch.Tensor:  # residual components (K, T, D) -> their terms (K,)
            s = readout.select(resid)
            s = s - s.mean(dim=-1, keepdim=True)
            return head(gamma * s / sigma) - zero

        heads = np.full((n, width), np.nan)
        mlps = np.zeros(n)
        rest_resid = f64(run.block_tokens(run.sites[0].index)[0]).clone()  # embeddings, then every bias

        def scale(x) -> torch.Tensor:  # a declared layer scale: None (none), a float, or a (D,) tensor
            return ones if x is None else ones * (f64(x) if isinstance(x, torch.Tensor) else float(x))

        for i, site in enumerate(run.sites):
            proj = projs[i]
            s1, s2 = scale(parts[i].attn_scale), scale(parts[i].mlp_scale)
            z = f64(run.activation(z_name(run, i)))  # (1, T, H * d), value bias included
            h = run.num_heads[i]
            w = f64(proj.weight)  # (D, H * d)
            per_head = torch.einsum("thj,ehj->hte", z[0].reshape(z.shape[1], h, -1), w.reshape(dim, h, -1)) * s1
            heads[i, :h] = part(per_head).numpy()
            b_o = f64(proj.bias) * s1 if proj.bias is not None else torch.zeros_like(ones)
            mlp = f64(run.activation(run.name(site.index, "mlp.out"))) * s2  # the MLP's own output
            fc2 = fam.mlp_output(site)
            b_2 = f64(fc2.bias) * s2 if fc2 is not None and fc2.bias is not None else torch.zeros_like(ones)
            mlps[i] = float(part(mlp - b_2)[0])
            rest_resid = rest_resid + b_o + b_2
        rest = float(part(rest_resid)[0] + head(beta.expand_as(v))[0])
    logit = float(t.select(run.scores.double()))
    total = float(np.nansum(heads) + mlps.sum() + rest)
    tol = max(1.0, abs(logit))
    if abs(total - logit) > READOUT_RTOL * tol:
        raise NotDefined(
            f"Direct logit attribution of '{loaded.name}' is refused: its parts (embeddings, heads, MLP outputs, "
            f"biases) add up to {total:.6g}, not the logit {logit:.6g}, so the {fam.name} adapter does not describe "
            "its blocks as they run (a layer scale, norm or residual branch it does not know)."
        )
    return Attribution(
        t.index, logit, frozen(heads), frozen(mlps), rest, frozen(sigma.reshape(-1).numpy()), readout.description, t
    )


def direct_logit_attribution(
    loaded: LoadedModel,
    image: Image.Image,
    *,
    target: Target | int | None = None,
    size: int | tuple[int, int] | None = None,
    budget_bytes: int = DEFAULT_BUDGET_BYTES,
) -> Attribution:
    """The value of ``target`` (a class logit, a difference of two; a class index; None: the top-1) split into
    heads, MLPs and the rest (see the module docstring).

    Raises :class:`NotDefined` with the reason where it does not apply (hierarchical models, no linear readout).
    """
    notes = causal_notes(loaded)
    if notes["attribution"]:
        raise NotDefined(notes["attribution"])
    run = clean_run(loaded, image, size, budget_bytes, target)
    return attribution_of_run(run, run.target(target))
