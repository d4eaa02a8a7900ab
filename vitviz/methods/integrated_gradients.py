"""``integrated_gradients``: Integrated Gradients (Sundararajan et al. 2017), pooled to the patch grid.

Definition. ``x``: the normalised model input ``(3, h, w)``; ``f(x) = y_c``, the target:
the class logit before softmax, a zero-shot label's score, or a difference of two. Baseline ``x'``: the input's per-channel mean image (every
pixel set to the mean colour of the input), the same image the deletion curve
converges to (``vitviz.evaluate.faithfulness``), so IG explains the change the
deletion curve measures; the mean is taken in normalised space, which equals
normalising the mean of the raw pixels (normalisation is per-channel affine).
``n_steps`` points (default 32) of the Gauss-Legendre rule, run in batches of ``batch_size``
(:func:`integrate`: captum's ``IntegratedGradients`` step for step, tested against it):

    a[ch, y, x] = (x - x')[ch, y, x] * integral_0^1 df/dx[ch, y, x](x' + t (x - x')) dt

Pixel attributions are summed over channels, **signed**, and summed over the pixels
of each first-stage cell (:func:`vitviz.methods.base.pool_to_grid`). Signed, so that
the map keeps completeness: it sums to ``f(x) - f(x')`` up to the integration error,
positive cells raise the logit relative to the baseline and negative ones lower it
(and faithfulness orders by largest first: positive evidence first).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from vitviz.capture.forward import forward_output
from vitviz.capture.targets import BoundTarget
from vitviz.methods.base import Inputs, Method, class_logits, pool_to_grid
from vitviz.models.load import LoadedModel

__all__ = ["IntegratedGradients", "gauss_legendre", "integrate", "mean_baseline", "pixel_attributions"]


def mean_baseline(pixels: torch.Tensor) -> torch.Tensor:
    """The per-channel mean image of ``pixels`` ``(B, 3, h, w)``: same shape, each channel constant."""
    return pixels.mean(dim=(2, 3), keepdim=True).expand_as(pixels).contiguous()


def _forward(loaded: LoadedModel, pixels: torch.Tensor, hw: tuple[int, int]):
    """The family's forward output of normalised pixels ``(B, 3, h, w)`` (grad mode is the caller's)."""
    return forward_output(loaded, pixels, hw)


def gauss_legendre(n_steps: int) -> tuple[list[float], list[float]]:
    """Step sizes and points of the ``n_steps``-point Gauss-Legendre rule on [0, 1] (captum's ``gausslegendre``).

    ``numpy.polynomial.legendre.leggauss`` on [-1, 1], rescaled: points ``(1 + x) / 2``, weights ``w / 2``.
    """
    x, w = np.polynomial.legendre.leggauss(int(n_steps))
    return (0.5 * w).tolist(), (0.5 * (1 + x)).tolist()


def integrate(
    f: Callable[[torch.Tensor], torch.Tensor],
    x: torch.Tensor,
    base: torch.Tensor,
    *,
    n_steps: int = 32,
    batch_size: int = 8,
) -> torch.Tensor:
    """Integrated gradients of ``f`` (``(B, ...) -> (B,)``) at ``x`` ``(1, ...)`` from ``base``: ``(1, ...)``.

    ``(x - base) * sum_i s_i grad f(base + a_i (x - base))`` with the Gauss-Legendre steps
    (:func:`gauss_legendre`), ``batch_size`` points per forward. The same operations in the
    same order as ``captum.attr.IntegratedGradients.attribute(x, base, n_steps=...,
    internal_batch_size=batch_size)`` (tested against it); written here because importing
    ``captum.attr`` pulls in matplotlib and IPython, seconds of the first Compare page.
    """
    steps, alphas = gauss_legendre(n_steps)
    total = None
    with torch.enable_grad():
        for i in range(0, n_steps, batch_size):
            s, a = steps[i : i + batch_size], alphas[i : i + batch_size]
            scaled = torch.cat([base + alpha * (x - base) for alpha in a], dim=0).requires_grad_()
            grads = torch.autograd.grad(torch.unbind(f(scaled)), scaled)[0]
            weighted = grads.contiguous().view(len(a), -1) * torch.tensor(s).float().view(len(a), 1).to(grads.device)
            part = (weighted.reshape((len(a), 1, *grads.shape[1:])).sum(dim=0) * (x - base)).detach()
            total = part if total is None else part + total
    return total


def pixel_attributions(
    loaded: LoadedModel,
    pixels: torch.Tensor,
    hw: tuple[int, int],
    target: int | Callable[[object], torch.Tensor],
    *,
    n_steps: int = 32,
    batch_size: int = 8,
    baseline: torch.Tensor | None = None,
) -> np.ndarray:
    """Integrated gradients of ``y_c`` for normalised ``pixels`` ``(1, 3, h, w)``: ``(3, h, w)`` float64, signed.

    ``target``: a class index (``y_c`` its logit), or a function of the forward's output giving ``(B,)`` (a
    bound :class:`~vitviz.capture.targets.Target`). ``baseline``: ``(1, 3, h, w)``, default :func:`mean_baseline`.
    """
    x = pixels.detach()
    base = mean_baseline(x) if baseline is None else baseline.detach().to(x)
    if isinstance(target, (int, np.integer)):
        c = int(target)

        def f(batch):
            return class_logits(loaded, batch, hw)[:, c]
    else:

        def f(batch):
            return target(_forward(loaded, batch, hw))

    attr = integrate(f, x, base, n_steps=n_steps, batch_size=batch_size)
    return attr[0].double().cpu().numpy()


class IntegratedGradients(Method):
    name = "integrated_gradients"
    title = "Integrated Gradients"
    definition = "Integrated Gradients of y_c from the per-channel mean image, signed, channels and cell pixels summed"

    def __init__(self, n_steps: int = 32, batch_size: int = 8) -> None:
        if n_steps < 1 or batch_size < 1:
            raise ValueError(f"n_steps and batch_size must be positive, got {n_steps} and {batch_size}")
        self.n_steps, self.batch_size = int(n_steps), int(batch_size)

    def describe(self, inputs: Inputs, seed: int) -> str:
        return f"{self.definition} ({self.n_steps} steps)"

    def compute(self, inputs: Inputs, target: BoundTarget | None, seed: int) -> np.ndarray:
        attr = pixel_attributions(
            inputs.loaded,
            inputs.pixels(),
            inputs.input_size,
            target,
            n_steps=self.n_steps,
            batch_size=self.batch_size,
        )
        return pool_to_grid(attr.sum(axis=0), inputs.grid)  # (gh, gw), sums per cell
