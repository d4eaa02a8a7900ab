"""``gradcam``: Grad-CAM (Selvaraju et al. 2017) for Vision Transformers, written here on vitviz's hooks.

Why not ``grad-cam`` (jacobgil/pytorch-grad-cam)? It imports torchvision and OpenCV
at import time, and installing it with its dependencies replaces our torch by a
6 GB CUDA build (``docs/definitions.md#explanation-methods``); the method is a few lines on top of the
capture hooks, so it lives here.

Definition. Activations ``A`` ``(N, C)``: the grid tokens *entering the last
attention block* (the block's input, prefix tokens and padding left out), rows in
row-major order on that block's grid ``(gh_L, gw_L)`` (the last stage's grid of a
hierarchical model; MobileViT: the block's unfolded patch rows ``(N, A * C)``, one
row per patch, offsets x channels, as ``Family.tokens`` gives them). ``y_c`` is the
target: the class logit before softmax, a zero-shot label's score, or a difference of two. Then

    w = mean_t dy_c / dA[t, :]                  (C,)  mean over the N grid tokens
    map[t] = ReLU(sum_c w_c A[t, c])            (N,)  -> (gh_L, gw_L)

placed on the first stage's grid by nearest cell (:func:`vitviz.methods.base.place_on_grid`).

Which layer, per family: always the last attention block's input (for models with
an attention-pooling head, SigLIP and AIMv2, the last encoder block's, not the
head's). This is the layer pytorch-grad-cam's own ViT and Swin recipes use
(``blocks[-1].norm1``, ``layers[-1].blocks[-1].norm1``), read before that LayerNorm
(the residual stream) rather than after it. The last block's *output* would not do
for CLS models: the classifier reads only the CLS token after a per-token LayerNorm,
so the gradient with respect to the output's patch tokens is exactly zero there.
The block input is the one the image's Run recorded (its graph: one backward, no forward of Grad-CAM's
own; a forward of its own only where the Run has no graph, over the memory budget), its gradient by
``torch.autograd.grad``; no ``.grad`` is written on the shared model.

**On the last CNN stage** (``GradCam(layer="cnn")``, ``explain(..., "gradcam", layer="cnn")``): for a
hybrid ViT, whose tokens are cells of a ResNet's feature map, the same formula on that map, Grad-CAM's
original setting: ``A`` ``(C, h', w')`` is the last ResNet stage's output (what the patch projection
reads), ``w = mean_{y,x} dy_c / dA[:, y, x]`` ``(C,)``, ``map = ReLU(sum_c w_c A[c])`` ``(h', w')``. The
family returns the map from the forward itself (``Family.forward_with_feature_map``: the model hands it
back with its output), so no hook is added; other families refuse with their ``feature_map_note``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import numpy as np
import torch

from vitviz.capture.forward import BlockRecorder, preprocess, run_forward
from vitviz.capture.targets import BoundTarget
from vitviz.errors import CaptureError
from vitviz.methods.base import Inputs, Method
from vitviz.models.families.base import Call
from vitviz.models.load import LoadedModel

__all__ = ["GradCam", "gradcam_map", "gradcam_of_run", "cnn_gradcam_map"]

_INPUT_KEYS = ("hidden_states", "hidden_state")


class _LastBlockInput(BlockRecorder):
    """Keeps the hook arguments of the last attention block that is not a pooling head (the live tensors)."""

    def __init__(self, loaded: LoadedModel, call: Call) -> None:
        super().__init__(loaded, call)
        self.last: tuple | None = None

    def block(self, site, g, raw, module, args, kwargs, output) -> None:
        if g.kind != "pool":
            self.last = (site, g, module, args, kwargs, output)


def _block_input(args: tuple, kwargs: dict) -> torch.Tensor:
    if args:
        return args[0]
    for key in _INPUT_KEYS:
        if key in kwargs:
            return kwargs[key]
    raise CaptureError("the last block was called without its hidden states: Grad-CAM cannot find its input")


def _with_input(args: tuple, kwargs: dict, value: torch.Tensor) -> tuple[tuple, dict]:
    """The same call with the block's input replaced by ``value``."""
    if args:
        return (value, *args[1:]), kwargs
    key = next(k for k in _INPUT_KEYS if k in kwargs)
    return args, {**kwargs, key: value}


def _cam(loaded: LoadedModel, call: Call, site, g, args: tuple, kwargs: dict, output, grad) -> np.ndarray:
    """``ReLU(A @ mean_t dA)`` on the block's grid, ``A`` and its gradient ``grad`` (the block input's shape) both
    rearranged by the family's own ``tokens`` (a pure reshape / slice of the block input), so prefix tokens,
    padding and MobileViT's unfolding are handled where the family knows them."""
    fam = loaded.family
    x = _block_input(args, kwargs)
    grad = torch.zeros_like(x) if grad is None else grad
    acts = fam.tokens(call, site, site.block, args, kwargs, output)[0].detach()  # (1, T, C)
    g_args, g_kwargs = _with_input(args, kwargs, grad)
    grads = fam.tokens(call, site, site.block, g_args, g_kwargs, output)[0]  # the same rearrangement of the gradient
    n = g.grid[0] * g.grid[1]
    p = g.num_prefix
    a = acts[0, p : p + n].double()  # (N, C)
    d = grads[0, p : p + n].double()
    weights = d.mean(dim=0)  # (C,)
    cam = torch.relu(a @ weights)  # (N,)
    return cam.reshape(g.grid).float().cpu().numpy()


def _scalar(loaded: LoadedModel, target: int | Callable[[object], torch.Tensor]) -> Callable[[object], torch.Tensor]:
    if isinstance(target, int):
        return lambda out: loaded.family.logits(loaded.model, out)[0, target]
    return lambda out: target(out).reshape(-1)[0]


def gradcam_map(
    loaded: LoadedModel, pixels: torch.Tensor, hw: tuple[int, int], target: int | Callable[[object], torch.Tensor]
) -> np.ndarray:
    """Grad-CAM ``(gh_L, gw_L)`` float32 on the last attention block's grid for normalised ``pixels`` ``(1, 3, h, w)``,
    from a forward of its own (:func:`gradcam_of_run` reads an image's Run instead).

    ``target``: a class index (its logit ``y_c``), or a function of the forward's output giving ``(1,)`` or a
    scalar (a bound :class:`~vitviz.capture.targets.Target`: a label's score, a difference of two).
    """
    call = Call(loaded.config, hw, 1)
    rec = _LastBlockInput(loaded, call)
    pixels = pixels.detach().clone().requires_grad_(True)  # the graph reaches every block; parameters need no grad
    with torch.enable_grad():
        out = run_forward(loaded, pixels, rec)
        if rec.last is None:
            raise CaptureError(f"'{loaded.name}' has no attention block before its head: nothing for Grad-CAM")
        site, g, _, args, kwargs, output = rec.last
        (grad,) = torch.autograd.grad(_scalar(loaded, target)(out), [_block_input(args, kwargs)], allow_unused=True)
    return _cam(loaded, call, site, g, args, kwargs, output, grad)


def gradcam_of_run(run, target: int | Callable[[object], torch.Tensor]) -> np.ndarray | None:
    """Grad-CAM as :func:`gradcam_map`, read from an image's :class:`~vitviz.capture.run.Run` (its graph: one
    backward, no forward); None where the run cannot give it (no graph: over the memory budget)."""
    found = [
        (s, g) for s, g in zip(run.sites, run.geometries, strict=True) if g.kind != "pool" and run.has_block(s.index)
    ]
    if not run.has_graph or not found:
        return None
    site, g = found[-1]
    output = run.block_output(site.index)
    if output is None:
        return None
    args, kwargs = run.block_call(site.index)
    (grad,) = run.gradients(_scalar(run.loaded, target), [_block_input(args, kwargs)])
    return _cam(run.loaded, Call(run.loaded.config, run.input_size, 1), site, g, args, kwargs, output, grad)


def cnn_gradcam_map(
    loaded: LoadedModel, pixels: torch.Tensor, hw: tuple[int, int], target: int | Callable[[object], torch.Tensor]
) -> np.ndarray:
    """Grad-CAM ``(h', w')`` float32 on the CNN feature map a hybrid ViT's tokens are cells of (the last ResNet
    stage's output), for normalised ``pixels`` ``(1, 3, h, w)``; ``target`` as in :func:`gradcam_map`.

    ``ReLU(sum_c w_c A[c])`` with ``w_c`` the mean over the map's cells of ``dy / dA[c]``. Raises
    :class:`CaptureError` for a model without such a map (the family's ``feature_map_note``).
    """
    fam = loaded.family
    note = fam.feature_map_note(loaded.config)
    if note:
        raise CaptureError(f"Grad-CAM on the last CNN stage is not defined for '{loaded.name}': {note}.")
    pixels = pixels.detach().clone().requires_grad_(True)  # the graph reaches the map; parameters need no grad
    inputs = fam.model_inputs(loaded, pixels, hw)
    with torch.enable_grad(), fam.running(loaded.model):
        out, fmap = fam.forward_with_feature_map(loaded.model, inputs)
        y = fam.logits(loaded.model, out)[0, target] if isinstance(target, int) else target(out).reshape(-1)[0]
        (grad,) = torch.autograd.grad(y, [fmap], allow_unused=True)
    a = fmap[0].detach().double()  # (C, h', w')
    d = torch.zeros_like(a) if grad is None else grad[0].double()
    weights = d.mean(dim=(1, 2))  # (C,)
    cam = torch.relu(torch.einsum("c,chw->hw", weights, a))
    return cam.float().cpu().numpy()


class GradCam(Method):
    """Grad-CAM; ``layer``: ``"tokens"`` (the tokens entering the last attention block, every family) or ``"cnn"``
    (the last CNN stage of a hybrid ViT)."""

    name = "gradcam"
    title = "Grad-CAM"
    definition = (
        "Grad-CAM on the tokens entering the last attention block: ReLU(sum_c mean_t(dy_c/dA[t,c]) A[t,c]), "
        "nearest cell on the first-stage grid"
    )
    cnn_definition = (
        "Grad-CAM on the last CNN stage's feature map (the map a hybrid ViT's tokens are cells of): "
        "ReLU(sum_c mean_yx(dy_c/dA[c,y,x]) A[c]), placed on the token grid"
    )

    def __init__(self, layer: Literal["tokens", "cnn"] = "tokens") -> None:
        if layer not in ("tokens", "cnn"):
            raise ValueError(f"Grad-CAM's layer is 'tokens' or 'cnn', got {layer!r}")
        self.layer = layer

    def unavailable(self, loaded: LoadedModel, target=None) -> str:
        if self.layer == "cnn":
            note = loaded.family.feature_map_note(loaded.config)
            if note:
                return f"Grad-CAM on the last CNN stage is not defined for {loaded.family.name}: {note}."
        return super().unavailable(loaded, target)

    def describe(self, inputs: Inputs, seed: int) -> str:
        return self.cnn_definition if self.layer == "cnn" else self.definition

    def compute(self, inputs: Inputs, target: BoundTarget | None, seed: int) -> np.ndarray:
        if self.layer == "tokens":
            got = gradcam_of_run(inputs.run, target)  # the image's one forward, with its graph
            if got is not None:
                return got
        pixels, _ = preprocess(inputs.loaded, [inputs.image], inputs.input_size)
        if self.layer == "cnn":  # the feature map comes back from a forward of its own (no hook reads it)
            return cnn_gradcam_map(inputs.loaded, pixels, inputs.input_size, target)
        return gradcam_map(inputs.loaded, pixels, inputs.input_size, target)
