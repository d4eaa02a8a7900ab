"""One interface for every explanation method: image + model + class in, one map on the patch grid out.

In the spirit of pytorch-grad-cam: every method is a :class:`Method` and overrides one
small function, ``compute``, which returns a raw map on *some* grid laid over the
model input (the method's own: the last block's grid for Grad-CAM, the first
stage's for rollout). The base class checks that the method applies to the model,
resolves the class, and places the map on the first stage's grid (the patch grid of
a plain ViT), so that every method's map can be compared cell by cell and fed to the
faithfulness curves (:mod:`vitviz.evaluate.faithfulness`).

Grids over the input (``docs/definitions.md#hierarchical-models``): cell ``(r, c)`` of a
``(gh, gw)`` grid covers rows ``[r H / gh, (r + 1) H / gh)`` and columns
``[c W / gw, (c + 1) W / gw)`` of the ``H x W`` model input. :func:`place_on_grid`
moves a map between two such grids; :func:`pool_to_grid` sums pixels into cells.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np
import torch
from PIL import Image

from vitviz.capture.forward import (
    BlockRecorder,
    capture,
    forward_output,
    input_size_for,
    preprocess,
    run_forward,
    token_layout,
)
from vitviz.capture.targets import BoundTarget, Target, TargetError, resolve_target
from vitviz.errors import VitvizError
from vitviz.models.families.base import Call
from vitviz.models.load import LoadedModel
from vitviz.record import Capture, frozen

__all__ = [
    "MethodError",
    "MethodMap",
    "Inputs",
    "Method",
    "place_on_grid",
    "pool_to_grid",
    "cell_of_pixels",
    "class_logits",
    "GeometryRecorder",
]


class MethodError(VitvizError):
    """An explanation method does not apply to this model (or this class); the message says why."""


@dataclass(frozen=True, eq=False)
class MethodMap:
    """One method's map for one image and class.

    ``values``: ``(gh, gw)`` float32, raw (not normalised), on ``grid``, the first
    stage's grid over the ``input_size`` (h, w) model input (the patch grid of a plain
    ViT). ``source_grid``: the grid the method computed on before it was placed on
    ``grid`` (see :func:`place_on_grid`). ``class_index``: the class explained (None
    only for class-agnostic methods on a backbone without classifier).
    ``definition``: one line saying exactly what the values are. ``target``: what was
    explained, for display (``Target.name``; "" for class-agnostic methods without one).
    """

    method: str
    values: np.ndarray = field(repr=False)
    grid: tuple[int, int]
    input_size: tuple[int, int]
    class_index: int | None
    definition: str
    source_grid: tuple[int, int]
    target: str = ""

    def __post_init__(self) -> None:
        frozen(self.values)


def _axis_matrix(source: int, target: int) -> np.ndarray:
    """``(target, source)`` weights placing one axis of a grid on another laid over the same length."""
    m = np.zeros((target, source), dtype=np.float64)
    if target >= source:  # finer (or equal): the source cell holding the target cell's centre
        m[np.arange(target), np.minimum(((np.arange(target) + 0.5) * source / target).astype(int), source - 1)] = 1.0
        return m
    owner = np.minimum(((np.arange(source) + 0.5) * target / source).astype(int), target - 1)  # centre rule
    m[owner, np.arange(source)] = 1.0
    for i in np.flatnonzero(m.sum(axis=1) == 0):  # a target cell holding no source centre: nearest source
        m[i, min(int((i + 0.5) * source / target), source - 1)] = 1.0
    return m / m.sum(axis=1, keepdims=True)


def place_on_grid(values: np.ndarray, grid: tuple[int, int]) -> np.ndarray:
    """A map ``(sh, sw)`` on one grid over the input -> ``(gh, gw)`` on another over the same input, float32.

    Per axis: where the target is at least as fine, each target cell takes the value of
    the source cell that contains its centre (nearest); where it is coarser, the mean
    of the source cells whose centres lie inside it (block average). Equal grids are
    returned unchanged (as float32).
    """
    v = np.asarray(values, dtype=np.float64)
    if v.shape == tuple(grid):
        return v.astype(np.float32)
    rows, cols = _axis_matrix(v.shape[0], grid[0]), _axis_matrix(v.shape[1], grid[1])
    return (rows @ v @ cols.T).astype(np.float32)


def cell_of_pixels(grid: tuple[int, int], input_size: tuple[int, int]) -> np.ndarray:
    """``(h, w)`` int64: the row-major index of the grid cell holding each pixel of the model input.

    Pixel (y, x) lies in cell ``(floor(y gh / h), floor(x gw / w))``, i.e. cell (r, c)
    covers rows ``[r h / gh, (r + 1) h / gh)``: the token a pixel falls in.
    """
    (gh, gw), (h, w) = grid, input_size
    rows = np.arange(h) * gh // h
    cols = np.arange(w) * gw // w
    return rows[:, None] * gw + cols[None, :]


def pool_to_grid(pixels: np.ndarray, grid: tuple[int, int]) -> np.ndarray:
    """Pixel values ``(h, w)`` -> ``(gh, gw)`` float64 sums per cell (:func:`cell_of_pixels`)."""
    p = np.asarray(pixels, dtype=np.float64)
    cells = cell_of_pixels(grid, p.shape)
    return np.bincount(cells.ravel(), weights=p.ravel(), minlength=grid[0] * grid[1]).reshape(grid)


class GeometryRecorder(BlockRecorder):
    """Keeps only each block's geometry (what the grids were): ``geometries[site index]``."""

    def block(self, site, g, raw, module, args, kwargs, output) -> None:
        return None


def class_logits(loaded: LoadedModel, pixels: torch.Tensor, hw: tuple[int, int]) -> torch.Tensor:
    """Class logits ``(B, C)`` of normalised pixels ``(B, 3, h, w)``; grad mode is the caller's, nothing recorded."""
    return loaded.family.logits(loaded.model, forward_output(loaded, pixels, hw))


class Inputs:
    """One image prepared for explanation, shared by the methods that run on it.

    The capture (attention of every block) and the first stage's grid are computed
    once, on first use. ``input_size`` is what the model sees (``input_size_for``).
    """

    def __init__(self, loaded: LoadedModel, image: Image.Image, *, size: int | tuple[int, int] | None = None) -> None:
        self.loaded, self.image, self.size = loaded, image, size
        self.input_size = input_size_for(loaded, size, image.size)
        self._capture: Capture | None = None
        self._grid: tuple[int, int] | None = None
        self._run = None

    @property
    def run(self):
        """The image's :class:`~vitviz.capture.run.Run` (cached: a view's Run is reused, else one forward with its
        autograd graph within the memory budget): what gradient methods read instead of a forward of their own."""
        if self._run is None:
            from vitviz.capture.run import get_run

            self._run = get_run(self.loaded, self.image, size=self.size)
        return self._run

    @property
    def capture(self) -> Capture:
        if self._capture is None:  # the image's Run's, where a view made one (no second forward)
            from vitviz.capture.run import peek_run

            run = peek_run(self.loaded, self.image, size=self.size)
            self._capture = (
                run.capture if run is not None else capture(self.loaded, self.image, size=self.size, top_k=1)
            )
        return self._capture

    def pixels(self) -> torch.Tensor:
        """Normalised model input ``(1, 3, h, w)`` on the model's device (a new tensor each call)."""
        return preprocess(self.loaded, [self.image], self.input_size)[0]

    @property
    def grid(self) -> tuple[int, int]:
        """The first stage's grid (the patch grid of a plain ViT) at this input size."""
        if self._grid is None:
            if self._capture is not None:
                self._grid = self._capture.grid
            elif not self.loaded.family.hierarchical:
                self._grid = token_layout(self.loaded, self.input_size)[1]
            else:  # the grids of hierarchical models come from the blocks as they ran: one forward
                rec = GeometryRecorder(self.loaded, Call(self.loaded.config, self.input_size, 1))
                with torch.inference_mode():
                    run_forward(self.loaded, self.pixels(), rec)
                self._grid = rec.geometries[min(rec.geometries)].grid
        return self._grid

    def predicted_class(self) -> int | None:
        """Top-1 class of the unperturbed input (None for a backbone without classifier)."""
        if not self.loaded.has_classifier:
            return None
        if self._capture is not None:
            return self._capture.predictions[0].index
        with torch.inference_mode():
            return int(class_logits(self.loaded, self.pixels(), self.input_size)[0].argmax())


class Method:
    """Base of every explanation method. Subclasses set the class attributes and override :meth:`compute`.

    ``class_specific``: the map depends on the class (needs class logits).
    ``needs_rollout``: undefined where the family has a ``rollout_note`` (MobileViT).
    ``uses_capture``: reads the capture of :class:`Inputs` (computed once per image).
    """

    name: ClassVar[str] = "?"
    title: ClassVar[str] = "?"
    definition: ClassVar[str] = ""
    class_specific: ClassVar[bool] = True
    needs_rollout: ClassVar[bool] = False
    uses_capture: ClassVar[bool] = False  # reads ``Inputs.capture`` (methods sharing an image share it)

    def unavailable(self, loaded: LoadedModel, target: Target | None = None) -> str:
        """Why this method does not apply to ``loaded`` ("" when it does); a zero-shot label ``target`` makes
        class-specific methods apply to two-tower models."""
        if self.needs_rollout:
            note = loaded.family.rollout_note(loaded.config)
            if note:
                return f"{self.title} is not defined for {loaded.family.name}: {note}"
        label_ok = target is not None and target.is_label and getattr(loaded, "zero_shot", False)
        if self.class_specific and not loaded.has_classifier and not label_ok:
            return f"{self.title} explains a class logit, and {loaded.no_classes}"
        return ""

    def describe(self, inputs: Inputs, seed: int) -> str:
        """The one-line definition stored with the map (methods with options or per-family choices override it)."""
        return self.definition

    def compute(self, inputs: Inputs, target: BoundTarget | None, seed: int) -> np.ndarray:
        """The raw map ``(sh, sw)`` on a grid laid over the model input (any grid; the base places it).

        ``target``: what to explain, bound to the model (``target(out)`` ``(B,)`` differentiable; None only for
        class-agnostic methods on a model without class logits)."""
        raise NotImplementedError

    def __call__(
        self,
        inputs: Inputs,
        *,
        target: Target | int | None = None,
        seed: int = 0,
    ) -> MethodMap:
        """The map for ``target`` (a :class:`~vitviz.capture.targets.Target`, or a class index); None: the
        predicted class."""
        t = resolve_target(target, predicted=inputs.predicted_class)
        why = self.unavailable(inputs.loaded, t)
        if why:
            raise MethodError(why)
        bound = None
        if t is not None:
            try:
                bound = t.bind(inputs.loaded)
            except TargetError as exc:
                if self.class_specific or inputs.loaded.has_classifier:
                    raise MethodError(str(exc)) from None
        raw = np.asarray(self.compute(inputs, bound, seed), dtype=np.float32)
        if raw.ndim != 2 or not np.all(np.isfinite(raw)):
            raise MethodError(f"{self.title} gave a map of shape {raw.shape} with non-finite values.")
        grid = inputs.grid
        return MethodMap(
            method=self.name,
            values=place_on_grid(raw, grid),
            grid=grid,
            input_size=inputs.input_size,
            class_index=None if t is None else t.index,
            definition=self.describe(inputs, seed),
            source_grid=(int(raw.shape[0]), int(raw.shape[1])),
            target="" if t is None else t.name(getattr(inputs.loaded, "id2label", None)),
        )
