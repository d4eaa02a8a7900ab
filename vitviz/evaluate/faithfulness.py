"""Which map can you trust? Deletion and insertion curves (Petsiuk et al. 2018, as used by Chefer et al. 2021).

Definitions (``docs/definitions.md#faithfulness``). A map ``m`` on the first stage's grid
(N cells; the patch grid of a plain ViT) and a class c:

* **Order**: the cells by ``m``, largest first; ties: lower (row-major) index first.
* **Steps**: ``k_i = min(i n, N)`` for i = 0..20 with ``n = ceil(N / 20)``: the points
  ``0, n, 2n, ..., N`` of the definition, always 21 of them, the last all cells. Where
  ``ceil(N / n) < 20`` (e.g. N = 144: n = 8 reaches N at i = 18) the last points repeat
  ``k = N``; a repeated point adds nothing to the area (zero width) and costs no forward.
* **Deletion**: in the model input (after resizing, before normalisation) the pixels
  of the first ``k`` cells of the order are replaced by the input's per-channel mean
  (mean over all its pixels); the curve is the softmax probability of c at each step.
  Lower area is more faithful.
* **Insertion**: start from an image that hides the evidence (the *insertion start*,
  :func:`insertion_start_image`) and put back the original pixels of the first ``k``
  cells. Higher is better. Starts (``docs/definitions.md#insertion-starts``):

  - ``blur``: the input blurred by a Gaussian of sigma = patch size / 2 pixels
    (:func:`gaussian_blur`): kernel ``exp(-d^2 / (2 sigma^2))`` truncated at
    ``round(4 sigma)`` pixels, normalised to sum 1, borders mirrored half-sample
    (``d c b a | a b c d``), i.e. ``scipy.ndimage.gaussian_filter(mode="reflect")``;
    RISE's start. It keeps colour: where colour is the evidence, insertion is flat.
  - ``mean``: every pixel the input's per-channel mean (the deletion fill);
  - ``grey``: every channel half its full range (127.5 / 255 of it: 0.5 on [0, 1]);
  - ``noise``: i.i.d. uniform values over each channel's full range, from
    ``numpy.random.default_rng(seed)`` (the caller's seed).

  The default, :data:`DEFAULT_INSERTION_START`, is ``mean``: on held-out demo images
  (colour is the evidence there) relevance and rollout insert faster than random under
  it, on more images than not (sign test, ``Results.versus``) and by the mean area, and
  not under ``blur`` (measured: ``docs/evaluate.md#insertion-starts``).
* **Area**: the trapezoid rule over the fraction ``k / N`` in [0, 1].
* **Peak in box**: the cell with the largest value (ties: lowest index) has its centre
  inside the object's box ``(x0, y0, x1, y1)`` in pixels of the model input (x1, y1
  exclusive).

Cells over the input: cell (r, c) of a ``(gh, gw)`` grid covers rows
``[r h / gh, (r + 1) h / gh)`` and columns ``[c w / gw, (c + 1) w / gw)``, so a pixel
belongs to the token it falls in, for plain and hierarchical models alike.

Cost: the perturbed images of both curves go through the model in batches of
``batch_size`` (no attention recorded). Images that do not depend on the map (the
original, the mean image, the blurred image) are forwarded once per image and shared
by every map evaluated on it (:class:`Perturbations`), and repeated images are
forwarded once: one curve pair of a ViT-B/16 at 224 (N = 196) needs 40 forwards
beyond the original.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from PIL import Image

from vitviz.capture.forward import (
    DEFAULT_BUDGET_BYTES,
    check_budget,
    forward_output,
    input_size_for,
    preprocess,
    run_forward,
    unnormalised,
)
from vitviz.capture.targets import Target, label_set, scorer_for
from vitviz.errors import VitvizError
from vitviz.insertion_starts import DEFAULT_INSERTION_START, INSERTION_STARTS
from vitviz.methods import Method, MethodMap, explain_many
from vitviz.methods.base import GeometryRecorder, cell_of_pixels
from vitviz.models.families.base import Call
from vitviz.models.load import LoadedModel
from vitviz.models.zeroshot import Labels
from vitviz.record import frozen

__all__ = [
    "POINTS",
    "Progress",
    "Faithfulness",
    "FaithfulnessError",
    "curve_steps",
    "patch_order",
    "trapezoid_area",
    "gaussian_blur",
    "blur_matrix",
    "INSERTION_STARTS",
    "DEFAULT_INSERTION_START",
    "insertion_start_image",
    "peak_in_box",
    "Perturbations",
    "faithfulness",
    "evaluate_methods",
]

POINTS = 21
Progress = Callable[[int, int], None]  # (images forwarded so far, images to forward) in this call


class FaithfulnessError(VitvizError):
    """A map or a model that the faithfulness curves cannot score; the message says why."""


@dataclass(frozen=True, eq=False)
class Faithfulness:
    """Deletion and insertion of one map of one image.

    ``steps`` ``(21,)`` int: cells perturbed at each point (k); ``fractions`` ``(21,)``:
    ``k / N``; ``deletion``, ``insertion`` ``(21,)`` float64: the probability of the target
    (class or label ``class_index``; a difference target: its probability minus the other's) at
    each point; ``*_area``: trapezoid areas over ``fractions``;
    ``probability``: that of the unperturbed input; ``peak_in_box``: None without a box.
    ``map``: the map that was scored. ``insertion_start``: what insertion started from
    (one of :data:`INSERTION_STARTS`).
    """

    map: MethodMap = field(repr=False)
    class_index: int
    label: str
    steps: np.ndarray = field(repr=False)
    fractions: np.ndarray = field(repr=False)
    deletion: np.ndarray = field(repr=False)
    insertion: np.ndarray = field(repr=False)
    deletion_area: float
    insertion_area: float
    probability: float
    peak_in_box: bool | None
    insertion_start: str = "blur"

    def __post_init__(self) -> None:
        for name in ("steps", "fractions", "deletion", "insertion"):
            frozen(getattr(self, name))

    @property
    def method(self) -> str:
        return self.map.method


# --- the definition, piece by piece --------------------------------------------------


def curve_steps(num_cells: int) -> np.ndarray:
    """``(21,)`` int64: ``k_i = min(i * ceil(N / 20), N)`` for i = 0..20."""
    if num_cells < 1:
        raise ValueError(f"a map needs at least one cell, got {num_cells}")
    n = math.ceil(num_cells / (POINTS - 1))
    return np.minimum(np.arange(POINTS, dtype=np.int64) * n, num_cells)


def patch_order(values: np.ndarray) -> np.ndarray:
    """``(N,)`` cell indices (row-major) by value, largest first; ties: lower index first."""
    v = np.asarray(values, dtype=np.float64).ravel()
    if not np.all(np.isfinite(v)):
        raise FaithfulnessError("the map has non-finite values: it cannot order the patches")
    return np.argsort(-v, kind="stable")


def trapezoid_area(fractions: np.ndarray, curve: np.ndarray) -> float:
    """``sum_i (x_{i+1} - x_i) (y_i + y_{i+1}) / 2``."""
    x, y = np.asarray(fractions, dtype=np.float64), np.asarray(curve, dtype=np.float64)
    return float(np.sum(np.diff(x) * (y[1:] + y[:-1]) / 2.0))


def blur_matrix(n: int, sigma: float, *, truncate: float = 4.0) -> np.ndarray:
    """``(n, n)`` float64 ``K`` with ``K @ v`` the 1-D Gaussian blur of ``v`` (module docstring), rows summing to 1."""
    radius = int(truncate * sigma + 0.5)
    taps = np.arange(-radius, radius + 1)
    kernel = np.exp(-0.5 * (taps / sigma) ** 2)
    kernel /= kernel.sum()
    src = np.arange(n)[:, None] + taps[None, :]  # (n, 2r + 1) source positions, before mirroring
    src = np.mod(src, 2 * n)
    src = np.where(src >= n, 2 * n - 1 - src, src)  # half-sample mirror, repeated as far as needed
    k = np.zeros((n, n), dtype=np.float64)
    np.add.at(k, (np.repeat(np.arange(n), taps.size), src.ravel()), np.tile(kernel, n))
    return k


def gaussian_blur(image: np.ndarray, sigma: float) -> np.ndarray:
    """Blur ``(C, h, w)`` per channel with a Gaussian of ``sigma`` pixels: ``K_h X K_w^T``, float64."""
    x = np.asarray(image, dtype=np.float64)
    kh, kw = blur_matrix(x.shape[1], sigma), blur_matrix(x.shape[2], sigma)
    return kh @ x @ kw.T  # (h, h) @ (C, h, w) @ (w, w)


def insertion_start_image(
    raw: np.ndarray, start: str, *, sigma: float, full_range: float = 1.0, seed: int = 0
) -> np.ndarray:
    """The image insertion starts from, ``(C, h, w)`` float64, for the model input ``raw`` ``(C, h, w)``.

    ``start``: one of :data:`INSERTION_STARTS` (module docstring); ``sigma``: the blur's,
    in pixels; ``full_range``: the largest value a channel can take (1.0 for inputs
    rescaled to [0, 1]); ``seed``: the noise generator's.
    """
    x = np.asarray(raw, dtype=np.float64)
    if start == "blur":
        return gaussian_blur(x, sigma)
    if start == "mean":
        return np.broadcast_to(x.mean(axis=(1, 2))[:, None, None], x.shape).copy()
    if start == "grey":
        return np.full(x.shape, 0.5 * full_range)
    if start == "noise":
        return np.random.default_rng(seed).uniform(0.0, full_range, size=x.shape)
    raise FaithfulnessError(f"unknown insertion start {start!r}; choose one of {', '.join(INSERTION_STARTS)}")


def peak_in_box(values: np.ndarray, box: Sequence[float], input_size: tuple[int, int]) -> bool:
    """Does the centre of the largest cell of ``values`` ``(gh, gw)`` (ties: lowest index) lie in ``box``?

    ``box``: ``(x0, y0, x1, y1)`` in pixels of the ``input_size`` (h, w) model input, x1/y1
    exclusive. The centre of cell (r, c) is ``((c + 0.5) w / gw, (r + 0.5) h / gh)``; with
    square p-pixel patches this is ``vitviz.demo.vit.peak_in_box`` exactly.
    """
    v = np.asarray(values)
    row, col = np.unravel_index(int(np.argmax(v)), v.shape)
    (gh, gw), (h, w) = v.shape, input_size
    cx, cy = (col + 0.5) * w / gw, (row + 0.5) * h / gh
    x0, y0, x1, y1 = box
    return bool(x0 <= cx < x1 and y0 <= cy < y1)


# --- the engine ----------------------------------------------------------------------


ORIGINAL, MEAN, START = 0, 1, 2  # what a cell shows in a perturbed image
BLUR = START  # the name of the start code when blur was the only start


class Perturbations:
    """One image, ready to score maps: the model input, its mean and insertion-start versions, and a cache of
    probabilities.

    Every perturbed image is a code per cell, ``ORIGINAL``, ``MEAN`` or ``START``;
    an image's softmax probabilities are cached by its code, so that the images no map
    changes (the original, the mean image, the start image) and any repeated image
    are forwarded once. ``insertion_start``: one of :data:`INSERTION_STARTS`; ``seed``:
    the noise start's generator seed. ``labels``: a zero-shot model's labels, whose scores (through
    :func:`~vitviz.capture.targets.scorer_for`, the Run's scorer) and probabilities (the model's rule)
    the curves follow; None: class logits and their softmax. Construction runs the original (one
    forward, batch 1), which also reads the first stage's grid from the blocks as they ran.
    """

    def __init__(
        self,
        loaded: LoadedModel,
        image: Image.Image,
        *,
        size: int | tuple[int, int] | None = None,
        batch_size: int = 20,
        budget_bytes: int = DEFAULT_BUDGET_BYTES,
        insertion_start: str = DEFAULT_INSERTION_START,
        seed: int = 0,
        labels: Labels | None = None,
    ) -> None:
        if insertion_start not in INSERTION_STARTS:
            raise FaithfulnessError(
                f"unknown insertion start {insertion_start!r}; choose one of {', '.join(INSERTION_STARTS)}"
            )
        self.insertion_start = insertion_start
        if labels is None and not loaded.has_classifier:
            raise FaithfulnessError(
                f"'{loaded.name}' is a backbone without a classifier: deletion and insertion need class probabilities."
            )
        if labels is not None and not loaded.zero_shot:
            raise FaithfulnessError(f"'{loaded.name}' has no text tower: labels need a two-tower model.")
        self.labels = labels
        self.scorer = scorer_for(loaded, labels)
        self.rule = "softmax" if labels is None else loaded.text.rule
        self.names = dict(enumerate(labels.names)) if labels is not None else dict(loaded.id2label or {})
        if batch_size < 1:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        self.loaded = loaded
        self.input_size = hw = input_size_for(loaded, size, image.size)
        check_budget(loaded, hw, batch=1, gradients=False, budget=budget_bytes)
        per_image = max(1, loaded.family.attention_numel(loaded.config, hw) * 4)
        self.batch_size = int(max(1, min(batch_size, budget_bytes // per_image)))
        pixels, resized = preprocess(loaded, [image], hw)
        self.raw = unnormalised(loaded, resized[:1])[0].transpose(2, 0, 1).copy()  # (3, h, w), as preprocess builds it
        self.sigma = loaded.patch_size / 2.0
        fills = {
            MEAN: np.broadcast_to(self.raw.mean(axis=(1, 2), dtype=np.float64)[:, None, None], self.raw.shape),
            START: insertion_start_image(
                self.raw, insertion_start, sigma=self.sigma, full_range=255.0 * loaded.rescale_factor, seed=seed
            ),
        }
        self._sources = torch.from_numpy(
            np.stack([self.raw, fills[MEAN].astype(np.float32), fills[START].astype(np.float32)])
        )  # (3 sources, 3, h, w) float32: ORIGINAL, MEAN, START
        self._mean = torch.tensor(loaded.image_mean, dtype=torch.float32).view(1, 3, 1, 1)
        self._std = torch.tensor(loaded.image_std, dtype=torch.float32).view(1, 3, 1, 1)
        rec = GeometryRecorder(loaded, Call(loaded.config, hw, 1))
        with torch.inference_mode():
            out = run_forward(loaded, pixels, rec)
            logits = self.scorer(out)
        self.grid: tuple[int, int] = rec.geometries[min(rec.geometries)].grid
        self.num_cells = self.grid[0] * self.grid[1]
        self._cells = torch.from_numpy(cell_of_pixels(self.grid, hw))  # (h, w) cell of each pixel
        self._cache: dict[bytes, np.ndarray] = {}
        self._cache[np.zeros(self.num_cells, np.uint8).tobytes()] = self._probabilities(logits)[0]
        self.forwards = 1  # images forwarded so far (for benchmarks and tests)

    def _probabilities(self, logits: torch.Tensor) -> np.ndarray:
        """Class probabilities by the model's rule: a softmax, or each label's own sigmoid (SigLIP labels)."""
        z = logits.detach().double()
        if self.rule == "sigmoid":
            return torch.sigmoid(z).cpu().numpy()
        return torch.softmax(z, dim=-1).cpu().numpy()

    @property
    def original_probabilities(self) -> np.ndarray:
        """``(C,)`` softmax probabilities of the unperturbed input."""
        return self._cache[np.zeros(self.num_cells, np.uint8).tobytes()]

    def images(self, codes: np.ndarray) -> torch.Tensor:
        """Normalised model inputs ``(K, 3, h, w)`` for cell codes ``(K, N)`` (ORIGINAL / MEAN / START per cell)."""
        per_pixel = torch.from_numpy(np.asarray(codes, dtype=np.int64))[:, self._cells]  # (K, h, w)
        src = self._sources  # (3, 3, h, w)
        x = torch.where((per_pixel == MEAN)[:, None], src[MEAN], src[ORIGINAL])
        x = torch.where((per_pixel == START)[:, None], src[START], x)
        x = (x - self._mean) / self._std
        return x.to(device=self.loaded.device, dtype=self.loaded.dtype)

    def probabilities(self, codes: np.ndarray, *, progress: Progress | None = None) -> np.ndarray:
        """Softmax probabilities ``(K, C)`` float64 of the images with cell codes ``(K, N)`` uint8, batched and cached."""
        codes = np.ascontiguousarray(codes, dtype=np.uint8)
        keys = [row.tobytes() for row in codes]
        todo = list(dict.fromkeys(k for k in keys if k not in self._cache))
        for start in range(0, len(todo), self.batch_size):
            chunk = todo[start : start + self.batch_size]
            batch = self.images(np.stack([np.frombuffer(k, dtype=np.uint8) for k in chunk]))
            with torch.inference_mode():
                probs = self._probabilities(self.scorer(forward_output(self.loaded, batch, self.input_size)))
            self._cache.update(zip(chunk, probs, strict=True))
            self.forwards += len(chunk)
            if progress is not None:
                progress(start + len(chunk), len(todo))
        return np.stack([self._cache[k] for k in keys])

    def curves(
        self,
        values: np.ndarray | MethodMap,
        *,
        target: Target | int | None = None,
        box: Sequence[float] | None = None,
        progress: Progress | None = None,
    ) -> Faithfulness:
        """Deletion and insertion of one map (a :class:`MethodMap` or ``(gh, gw)`` values on :attr:`grid`).

        ``target`` (a :class:`Target` of these scores, or an index): default the map's class or label, else the
        predicted one.
        """
        return self.curves_many([values], target=target, box=box, progress=progress)[0]

    def curves_many(
        self,
        maps: Sequence[np.ndarray | MethodMap],
        *,
        target: Target | int | None = None,
        box: Sequence[float] | None = None,
        progress: Progress | None = None,
    ) -> list[Faithfulness]:
        """:meth:`curves` of several maps, their perturbed images forwarded together in full batches."""
        mmaps = [m if isinstance(m, MethodMap) else self._wrap(m) for m in maps]
        targets = [self._target(m, target) for m in mmaps]
        steps = curve_steps(self.num_cells)
        codes = np.concatenate([self._codes(m, steps) for m in mmaps])  # (2 * 21 * maps, N)
        probs = self.probabilities(codes, progress=progress).reshape(len(mmaps), 2, POINTS, -1)
        fractions = steps / self.num_cells
        out = []
        for mmap, t, p in zip(mmaps, targets, probs, strict=True):
            deletion, insertion = t.select(p[0]), t.select(p[1])  # (21,) each: the target's probability
            out.append(
                Faithfulness(
                    map=mmap,
                    class_index=t.index,
                    label=self._label(t),
                    steps=steps.copy(),
                    fractions=fractions.copy(),
                    deletion=deletion,
                    insertion=insertion,
                    deletion_area=trapezoid_area(fractions, deletion),
                    insertion_area=trapezoid_area(fractions, insertion),
                    probability=float(t.select(self.original_probabilities)),
                    peak_in_box=None if box is None else peak_in_box(mmap.values, box, self.input_size),
                    insertion_start=self.insertion_start,
                )
            )
        return out

    def _codes(self, mmap: MethodMap, steps: np.ndarray) -> np.ndarray:
        """Cell codes ``(2 * 21, N)``: the deletion images, then the insertion images."""
        if mmap.grid != self.grid or mmap.values.shape != self.grid:
            raise FaithfulnessError(
                f"the map is on a {mmap.values.shape[0]} x {mmap.values.shape[1]} grid, but the model sees this image "
                f"on a {self.grid[0]} x {self.grid[1]} grid: compute the map at the same input size"
            )
        if mmap.input_size != self.input_size:
            raise FaithfulnessError(
                f"the map was computed at {mmap.input_size[1]} x {mmap.input_size[0]} px, the curves run at "
                f"{self.input_size[1]} x {self.input_size[0]} px: use the same size"
            )
        rank = np.empty(self.num_cells, dtype=np.int64)
        rank[patch_order(mmap.values)] = np.arange(self.num_cells)
        first_k = rank[None, :] < steps[:, None]  # (21, N): the cell is among the first k of the order
        deletion = np.where(first_k, MEAN, ORIGINAL)
        insertion = np.where(first_k, ORIGINAL, START)
        return np.concatenate([deletion, insertion]).astype(np.uint8)

    def _target(self, mmap: MethodMap, target: Target | int | None) -> Target:
        """``target`` (default: the map's class or label, else the predicted one), checked against the scores."""
        given = mmap.class_index if target is None else target
        if given is None:
            given = int(np.argmax(self.original_probabilities))
        t = given if isinstance(given, Target) else Target(int(given), None, *self._label_set())
        n_classes = self.original_probabilities.shape[0]
        for i in (t.index, t.minus):
            if i is not None and not 0 <= int(i) < n_classes:
                raise FaithfulnessError(f"class {i} is outside 0..{n_classes - 1}")
        return t

    def _label_set(self) -> tuple:
        """``(labels, prompts)`` of a label target of these scores (``(None, None)``: class logits)."""
        return (None, None) if self.labels is None else (self.labels.names, self.labels.prompts)

    def _label(self, t: Target) -> str:
        """The target for display: the class or label name (``"A minus B"`` for a difference)."""
        a = self.names.get(t.index, f"class {t.index}")
        return a if t.minus is None else f"{a} minus {self.names.get(t.minus, f'class {t.minus}')}"

    def _wrap(self, values: np.ndarray) -> MethodMap:
        v = np.array(values, dtype=np.float32)
        if v.ndim != 2:
            raise FaithfulnessError(f"a map must be 2-D (gh, gw), got shape {v.shape}")
        shape = (int(v.shape[0]), int(v.shape[1]))
        return MethodMap("custom", v, shape, self.input_size, None, "a map given by the caller", shape)


def faithfulness(
    loaded: LoadedModel,
    image: Image.Image,
    values: np.ndarray | MethodMap,
    *,
    target: Target | int | None = None,
    box: Sequence[float] | None = None,
    size: int | tuple[int, int] | None = None,
    batch_size: int = 20,
    progress: Progress | None = None,
    insertion_start: str = DEFAULT_INSERTION_START,
    seed: int = 0,
) -> Faithfulness:
    """Deletion and insertion curves of one map of ``image`` (see the module docstring).

    ``values``: a :class:`MethodMap` (its class and input size are used) or raw ``(gh, gw)``
    values on the first stage's grid at input ``size``. To score several maps of one
    image, build one :class:`Perturbations` and call its ``curves`` (the images no map
    changes are then forwarded once). ``insertion_start``, ``seed``: as :class:`Perturbations`; a label
    ``target`` scores its labels.
    """
    if isinstance(values, MethodMap) and size is None:
        size = values.input_size
    pert = Perturbations(
        loaded,
        image,
        size=size,
        batch_size=batch_size,
        insertion_start=insertion_start,
        seed=seed,
        labels=label_set(target),
    )
    return pert.curves(values, target=target, box=box, progress=progress)


def evaluate_methods(
    loaded: LoadedModel,
    image: Image.Image,
    methods: Sequence[str | Method] | None = None,
    *,
    target: Target | int | None = None,
    box: Sequence[float] | None = None,
    size: int | tuple[int, int] | None = None,
    seed: int = 0,
    batch_size: int = 20,
    progress: Progress | None = None,
    insertion_start: str = DEFAULT_INSERTION_START,
) -> dict[str, Faithfulness]:
    """Every method's map of ``image`` (default: all that apply) and its curves, for one class.

    ``target`` None: the predicted class (a label target: its labels' scores). ``progress(done, total)`` counts the
    perturbed images forwarded (all methods' images go through the model together).
    Maps come from :func:`vitviz.methods.explain_many` (one capture shared). ``seed`` also
    seeds the noise start.
    """
    maps = explain_many(loaded, image, methods, target=target, size=size, seed=seed)
    pert = Perturbations(
        loaded,
        image,
        size=size,
        batch_size=batch_size,
        insertion_start=insertion_start,
        seed=seed,
        labels=label_set(target),
    )
    scored = pert.curves_many(list(maps.values()), target=target, box=box, progress=progress)
    return dict(zip(maps, scored, strict=True))
