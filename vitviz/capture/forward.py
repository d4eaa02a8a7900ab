"""One forward pass -> one immutable :class:`~vitviz.record.Capture` per image.

Attention is read by the hooks installed when the model was loaded
(``vitviz.models.hooks``); a capture call sets its own recorder for the length of
its forward, so many sessions and threads can capture from one cached model at
once. As each block finishes, its float32 probabilities are reduced to what the
record keeps: a float16 copy in native form for display, the float32 head mean
(rollout reads it), and float32 per-head summaries (mean attention distance,
entropy). The float32 weights of a block are released before the next block runs.
A :class:`~vitviz.capture.run.Run` keeps them anyway (its graph holds them), so its
summaries are computed when first read (:class:`~vitviz.record.Summaries`).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image

from vitviz.analysis.blocks import block_summaries
from vitviz.errors import BudgetError, CaptureError
from vitviz.models.families.base import Call, to_native
from vitviz.models.hooks import Site, installed_sites, recording
from vitviz.models.load import LoadedModel
from vitviz.record import Block, Capture, Geometry, Prediction, Stage, Summaries

__all__ = [
    "Prediction",
    "Capture",
    "DEFAULT_BUDGET_BYTES",
    "input_size_for",
    "SIZE_FACTORS",
    "offered_heights",
    "estimate_capture_bytes",
    "check_budget",
    "token_layout",
    "predictions_from_logits",
    "preprocess",
    "unnormalised",
    "run_forward",
    "forward_output",
    "capture",
    "capture_batch",
    "captures_from",
]

# What one capture may hold (attention of all layers and heads); VITVIZ_MEMORY_BUDGET_MB overrides 2 GiB.
DEFAULT_BUDGET_BYTES = int(os.environ.get("VITVIZ_MEMORY_BUDGET_MB", "2048")) * 2**20


def input_size_for(
    loaded: LoadedModel, size: int | tuple[int, int] | None = None, image_wh: tuple[int, int] | None = None
) -> tuple[int, int]:
    """(h, w) the model will see: the processor's default, or ``size`` snapped to the family's multiple.

    A family that runs at one size only (PvT v1) always gets that size; a family that
    follows each image's aspect ratio (SigLIP 2 NaFlex) adapts it to ``image_wh``.
    """
    fixed = loaded.family.fixed_size(loaded.config)
    if fixed is not None:
        return fixed
    if size is None:
        h, w = loaded.default_size
    elif isinstance(size, int):
        h = w = size
    else:
        h, w = size
    m = loaded.family.size_multiple(loaded.config)
    h, w = max(m, round(h / m) * m), max(m, round(w / m) * m)
    return loaded.family.size_for_image(loaded.config, (int(h), int(w)), image_wh)


SIZE_FACTORS = (0.5, 0.75, 1.0, 1.25, 1.5, 2.0)  # the input heights offered, as multiples of the model's own


def offered_heights(loaded: LoadedModel) -> list[int]:
    """The input heights (px) the app offers for ``loaded``: :data:`SIZE_FACTORS` times its own, in whole patches
    (at least one), ascending."""
    h, p = loaded.default_size[0], loaded.patch_size
    return sorted({max(p, round(h * f / p) * p) for f in SIZE_FACTORS})


def estimate_capture_bytes(
    num_layers: int, num_heads: int, num_tokens: int, *, batch: int = 1, gradients: bool = False, itemsize: int = 4
) -> int:
    """Memory a plain ViT's attention takes: L x H x T^2 values per image, doubled with gradients."""
    return num_layers * num_heads * num_tokens**2 * itemsize * batch * (2 if gradients else 1)


def token_layout(loaded: LoadedModel, hw: tuple[int, int]) -> tuple[tuple[str, ...], tuple[int, int]]:
    """(prefix token kinds, first-stage grid (gh, gw)) of ``loaded`` at input size ``hw``."""
    p = loaded.patch_size
    return loaded.family.prefix_kinds(loaded.config), (hw[0] // p, hw[1] // p)


def _size(n: int) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


def check_budget(loaded: LoadedModel, hw: tuple[int, int], *, batch: int, gradients: bool, budget: int) -> None:
    """Refuse, before any forward, an input the model cannot run at or whose attention would exceed ``budget``."""
    problem = loaded.family.size_problem(loaded.config, hw)
    if problem:
        raise BudgetError(problem)
    need = loaded.family.attention_numel(loaded.config, hw) * 4 * batch * (2 if gradients else 1)
    if need > budget:
        own_h, own_w = loaded.default_size
        long_side_over = max(hw) > max(own_h, own_w)
        if min(hw) <= min(own_h, own_w) and long_side_over:  # no wider than the model's own: long, not large
            advice = (
                f"Its shorter side is already {min(hw)} px: it is large because it is long and thin; choose a shape "
                f"closer to the model's own {own_w} x {own_h} px (width x height)."
            )
        elif tuple(hw) == (own_h, own_w) or not long_side_over:  # the model's own size (or smaller) is too much
            advice = (
                "Choose a smaller input size than the model's own, or raise the budget (VITVIZ_MEMORY_BUDGET_MB) "
                "if the machine has the memory."
            )
        else:
            advice = f"Choose a smaller input size (e.g. {own_w} px)."
        raise BudgetError(
            f"An input of {hw[1]} x {hw[0]} px (width x height) needs about {_size(need)} for attention maps"
            f"{' and their gradients' if gradients else ''}, over the {_size(budget)} budget "
            f"(VITVIZ_MEMORY_BUDGET_MB). {advice}"
        )


def crop_box(loaded: LoadedModel, size: tuple[int, int], hw: tuple[int, int]) -> tuple[int, int, int, int, int, int]:
    """Where a ``size`` = (w, h) image goes for an input ``hw`` = (h, w): ``(W, H, left, top, right, bottom)``, the
    size it is resized to and the box of that kept.

    Without :attr:`~vitviz.models.load.LoadedModel.center_crop`: the whole image, resized to ``hw``. With
    (crop side ``C``, shortest edge ``S``): resized, aspect kept, to cover ``(h * S // C, w * S // C)`` (for a
    square input, the short side becomes ``h * S // C`` and the long one ``int(short * long / short_side)``, as
    torchvision's ``Resize(int)``), then the centre ``hw`` kept (torchvision's ``CenterCrop`` rounding): at the
    folder's own size, the original's ``Resize(S)`` + ``CenterCrop(C)`` exactly.
    """
    h, w = hw
    if loaded.center_crop is None:
        return w, h, 0, 0, w, h
    c, s = loaded.center_crop
    th, tw = h * s // c, w * s // c
    iw, ih = size
    if tw / iw >= th / ih:  # the width binds
        nw, nh = tw, max(th, int(tw * ih / iw))
    else:
        nw, nh = max(tw, int(th * iw / ih)), th
    left, top = round((nw - w) / 2.0), round((nh - h) / 2.0)  # round half to even, as torchvision's int(round())
    return nw, nh, left, top, left + w, top + h


def seen_part(loaded: LoadedModel, photo: Image.Image, hw: tuple[int, int]) -> Image.Image:
    """The part of ``photo`` the model sees at input ``hw``, at the photo's own resolution: the photo itself, or
    its centre crop (:func:`crop_box`), for drawing maps over the photo where they belong."""
    if loaded.center_crop is None:
        return photo
    nw, nh, left, top, right, bottom = crop_box(loaded, photo.size, hw)
    sx, sy = photo.width / nw, photo.height / nh
    return photo.crop((round(left * sx), round(top * sy), round(right * sx), round(bottom * sy)))


def _model_view(loaded: LoadedModel, img: Image.Image, hw: tuple[int, int]) -> np.ndarray:
    rgb = img.convert("RGB")
    nw, nh, left, top, right, bottom = crop_box(loaded, rgb.size, hw)
    return np.asarray(rgb.resize((nw, nh), loaded.resample).crop((left, top, right, bottom)))


def preprocess(
    loaded: LoadedModel, images: Sequence[Image.Image], hw: tuple[int, int]
) -> tuple[torch.Tensor, np.ndarray]:
    """Resize to ``hw`` and normalise as the model's image processor does.

    No centre crop, unless the model's folder asks for it (:attr:`~vitviz.models.load.LoadedModel.center_crop`,
    vitviz's converted checkpoints): the model sees the whole image, so maps overlay it exactly; with the crop,
    maps cover the crop (:func:`seen_part` of the photo). Returns pixel values ``(B, 3, h, w)`` on the model's
    device and the resized (and cropped) uint8 images ``(B, h, w, 3)``, what the model saw.
    """
    resized = np.stack([_model_view(loaded, img, hw) for img in images])
    x = (unnormalised(loaded, resized) - np.asarray(loaded.image_mean, np.float32)) / np.asarray(
        loaded.image_std, np.float32
    )
    pixels = torch.from_numpy(x).permute(0, 3, 1, 2).contiguous()
    return pixels.to(device=loaded.device, dtype=loaded.dtype), resized


def unnormalised(loaded: LoadedModel, resized: np.ndarray) -> np.ndarray:
    """The model input before normalisation: uint8 ``(B, h, w, 3)`` RGB -> float32, channels in the model's order
    (BGR where its processor flips them) and rescaled (``[0, 1]`` usually). Perturbations are made here."""
    return resized[..., list(loaded.channel_order)].astype(np.float32) * loaded.rescale_factor


class BlockRecorder:
    """Base recorder: pairs each site's probabilities with its block and reads the block's geometry."""

    def __init__(self, loaded: LoadedModel, call: Call) -> None:
        self.loaded, self.call = loaded, call
        self._pending: dict[int, torch.Tensor | None] = {}
        self.geometries: dict[int, Geometry] = {}
        self.missing = 0  # sites whose module returned no weights (fused attention)

    def on_attention(self, site: Site, module, args, kwargs, output) -> None:
        self._pending[site.index] = self.loaded.family.probs(self.call, site, module, args, kwargs, output)

    def on_block(self, site: Site, module, args, kwargs, output) -> None:
        raw = self._pending.pop(site.index, None)
        if raw is None:
            self.missing += 1
            return
        g = self.loaded.family.geometry(self.call, site, module, args, kwargs, output, raw)
        self.geometries[site.index] = g
        self.block(site, g, raw, module, args, kwargs, output)

    def block(self, site: Site, g: Geometry, raw: torch.Tensor, module, args, kwargs, output) -> None:
        raise NotImplementedError


@dataclass
class _BlockArrays:
    attention: np.ndarray  # (B, *native) float16 (or float32), or a view into the plain stack
    fused: np.ndarray  # (B, *native without heads) float32
    summaries: list[Summaries]  # per image: distance, entropy, entropy_norm


class SummaryRecorder(BlockRecorder):
    """What :func:`capture_batch` keeps of each block, computed from its float32 weights as it arrives.

    ``lazy_summaries``: the per-head summaries are computed on their first read, from the block's float32
    weights, which the recorder's owner keeps anyway (a Run's live probabilities): not at all if no view reads
    them. Otherwise now, and the float32 weights are released before the next block runs.
    """

    def __init__(
        self, loaded: LoadedModel, call: Call, attention_dtype: str, num_sites: int, *, lazy_summaries: bool = False
    ) -> None:
        super().__init__(loaded, call)
        self.lazy_summaries = lazy_summaries
        self.dtype = getattr(torch, attention_dtype)
        self.num_sites = num_sites
        self.arrays: dict[int, _BlockArrays] = {}
        self.norms: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self.stack: np.ndarray | None = None  # (B, L, H, T, T) for plain models
        self._scratch: torch.Tensor | None = None

    def scratch(self, shape: torch.Size, dtype: torch.dtype, device: torch.device) -> torch.Tensor | None:
        """One buffer for every block's probabilities (:func:`vitviz.models.hooks.scratch_for`): lent only when the
        summaries are computed as each block ends and while no block's probabilities wait to be read, since what
        the record keeps is copied out of them before the next block runs."""
        if self.lazy_summaries or self._pending:
            return None
        buf = self._scratch
        if buf is None or buf.shape != shape or buf.dtype != dtype or buf.device != device:
            buf = self._scratch = torch.empty(shape, dtype=dtype, device=device)
        return buf

    def _store(self, site: Site, g: Geometry, native: torch.Tensor) -> np.ndarray:
        if self.loaded.family.hierarchical or g.kind != "global":  # a pooling head stays out of the stack
            return native.to(self.dtype, copy=True).cpu().numpy()  # a copy: ``native`` may be a lent buffer
        if self.stack is None:
            dtype = torch.empty(0, dtype=self.dtype).numpy().dtype
            self.stack = np.empty((native.shape[0], self.num_sites, *native.shape[1:]), dtype=dtype)
        # Cast straight into the stack (torch's threaded copy): no intermediate array, a quarter of the time. On a
        # GPU, cast there first: a copy that converts while it crosses devices ran at 0.6 GB/s (72 ms per block of
        # DINOv2 at 518 px on an H200), the plain copy of the cast values at the bus's speed.
        src = native if native.device.type == "cpu" else native.to(self.dtype)
        torch.from_numpy(self.stack[:, site.index]).copy_(src)
        return self.stack[:, site.index]

    def _lazy(self, g: Geometry, raw: torch.Tensor, image: int) -> Summaries:
        # The closure holds the weights' storage (kept by the owner anyway), detached: a record that outlives its
        # Run must not keep the Run's autograd graph alive through them.
        call, weights = self.call, raw.detach()

        def compute():
            with torch.no_grad():
                full = to_native(g, weights, call.batch).float()
                return block_summaries(g, _on_host_unless_global(g, full[image]), call.input_size)

        return Summaries(compute=compute, num_heads=g.num_heads, pending_bytes=weights.nbytes // call.batch)

    def block(self, site, g, raw, module, args, kwargs, output) -> None:
        native = to_native(g, raw.detach(), self.call.batch)
        f32 = native.float()
        head_axis = {"global": 1, "pool": 1, "window": 2, "unfolded": 2}.get(g.kind)
        fused = (f32 if head_axis is None else f32.mean(dim=head_axis)).cpu().numpy()
        # Lazy on the CPU only: on a GPU the summaries take milliseconds there, and a pending record would keep the
        # block's float32 weights in GPU memory for as long as any cache holds the record.
        if self.lazy_summaries and raw.device.type == "cpu":
            summaries = [self._lazy(g, raw, i) for i in range(self.call.batch)]
        else:
            summaries = [
                Summaries(block_summaries(g, _on_host_unless_global(g, f32[i]), self.call.input_size))
                for i in range(self.call.batch)
            ]
        self.arrays[site.index] = _BlockArrays(self._store(site, g, native), fused, summaries)
        tokens = self.loaded.family.tokens(self.call, site, module, args, kwargs, output)
        if tokens is not None:
            self.norms[site.index] = tuple(t.detach().float().norm(dim=-1).cpu().numpy() for t in tokens)


def _on_host_unless_global(g: Geometry, native: torch.Tensor):
    """What :func:`~vitviz.analysis.blocks.block_summaries` reads: global blocks' float32 weights where they are (on
    a GPU their summaries are computed there: copying 12 x 1370^2 weights a block to the host and reducing them
    there took 10 times the forward), other kinds' as a numpy array (zero-copy on the CPU)."""
    if g.kind == "global" and native.device.type != "cpu":
        return native
    return native.cpu().numpy()


def forward_output(loaded: LoadedModel, pixels: torch.Tensor, hw: tuple[int, int], *, model=None):
    """The family's forward output of normalised pixels ``(B, 3, h, w)`` at input size ``hw``: the one place (with
    :func:`run_forward`) that calls a model's forward. Grad mode, recorders and edits are the caller's (a call
    state set around it). ``model``: a stand-in sharing ``loaded.model``'s parameters (AttnLRP's rule copy)."""
    fam = loaded.family
    with fam.running(loaded.model):
        return fam.forward(loaded.model if model is None else model, fam.model_inputs(loaded, pixels, hw))


def run_forward(loaded: LoadedModel, pixels: torch.Tensor, recorder: BlockRecorder):
    """The model's forward with ``recorder`` receiving this call's hook calls; grad mode is the caller's."""
    sites = installed_sites(loaded.model)
    inputs = loaded.family.model_inputs(loaded, pixels, recorder.call.input_size)
    with loaded.family.running(loaded.model), recording(recorder):
        out = loaded.family.forward(loaded.model, inputs)
    if not sites or recorder.missing or len(recorder.geometries) != len(sites):
        raise CaptureError(
            f"'{loaded.name}' returned no attention weights from {recorder.missing or len(sites) or 'any'} of its "
            f"{len(sites)} attention blocks: it must run with eager attention (fused SDPA / flash kernels never "
            "materialise them)."
        )
    return out


def predictions_from_logits(
    logits: np.ndarray, id2label: dict[int, str], k: int | None = None
) -> tuple[Prediction, ...]:
    """Classes ranked by softmax probability (all of them when ``k`` is None): ``(C,) -> k predictions``."""
    z = logits.astype(np.float64)
    probs = np.exp(z - z.max())
    probs /= probs.sum()
    order = np.argsort(-probs, kind="stable")[:k]
    return tuple(Prediction(int(i), id2label.get(int(i), f"class {i}"), float(probs[i]), float(z[i])) for i in order)


def build_stages(loaded: LoadedModel, geometries: Sequence[Geometry], norms: dict, image: int) -> tuple[Stage, ...]:
    """Group blocks (in forward order) into stages; the merge rule between stages comes from the family."""
    by_stage: dict[int, list[int]] = {}
    for i, g in enumerate(geometries):
        by_stage.setdefault(g.stage, []).append(i)
    stages = []
    for s, idx in enumerate(by_stage.values()):
        first = geometries[idx[0]]
        if any(geometries[i].grid != first.grid or geometries[i].prefix_kinds != first.prefix_kinds for i in idx):
            raise CaptureError(f"blocks of stage {s} disagree on their grid; the {loaded.family.name} adapter is wrong")
        parents = None if s == 0 else loaded.family.merge_parents(geometries[stages[-1].blocks[-1]], first)
        have = [i for i in idx if i in norms]  # a pooling head has no tokens of its own
        rows = [norms[have[0]][0][image]] + [norms[i][1][image] for i in have] if have else None
        stage_norms = np.stack(rows).astype(np.float32) if rows else None
        stages.append(Stage(s, first.grid, first.prefix_kinds, tuple(idx), parents, stage_norms))
    return tuple(stages)


def _stacked(geometries: Sequence[Geometry]) -> int:
    """How many leading blocks the plain (L, H, T, T) stack holds: the global ones (a pooling head comes last)."""
    n = sum(g.kind == "global" for g in geometries)
    if any(g.kind != "global" for g in geometries[:n]):
        raise CaptureError("a plain model's global blocks must come before its pooling head")
    return n


def capture_batch(
    loaded: LoadedModel,
    images: Sequence[Image.Image],
    *,
    size: int | tuple[int, int] | None = None,
    top_k: int = 5,
    attention_dtype: str = "float16",
    budget_bytes: int = DEFAULT_BUDGET_BYTES,
) -> list[Capture]:
    """Capture a batch of images: one forward pass per input size (usually one for the whole batch).

    ``attention_dtype`` float16 (default) halves the record; attention weights lie in
    [0, 1], where float16 keeps about 3 significant digits. Every summary is computed
    from the float32 weights whatever is stored. Use float32 storage for parity work.
    """
    sizes = [input_size_for(loaded, size, img.size) for img in images]
    out: list[Capture | None] = [None] * len(images)
    for hw in dict.fromkeys(sizes):  # images that share an input size share a forward pass
        idx = [i for i, s in enumerate(sizes) if s == hw]
        for i, cap in zip(
            idx, _capture_at(loaded, [images[i] for i in idx], hw, top_k, attention_dtype, budget_bytes), strict=True
        ):
            out[i] = cap
    return out


def _capture_at(
    loaded: LoadedModel,
    images: Sequence[Image.Image],
    hw: tuple[int, int],
    top_k: int,
    attention_dtype: str,
    budget_bytes: int,
) -> list[Capture]:
    check_budget(loaded, hw, batch=len(images), gradients=False, budget=budget_bytes)
    pixels, resized = preprocess(loaded, images, hw)
    call = Call(loaded.config, hw, len(images))
    rec = SummaryRecorder(loaded, call, attention_dtype, len(installed_sites(loaded.model)))
    with torch.inference_mode():
        out = run_forward(loaded, pixels, rec)
    return captures_from(loaded, rec, out, resized, hw, top_k)


def captures_from(
    loaded: LoadedModel, rec: SummaryRecorder, out, resized: np.ndarray, hw: tuple[int, int], top_k: int
) -> list[Capture]:
    """The frozen records of a forward ``out`` that ``rec`` summarised (one per image of the batch)."""
    fam = loaded.family
    with torch.no_grad():
        raw_logits = fam.logits(loaded.model, out) if loaded.has_classifier else None
        logits = None if raw_logits is None else raw_logits.detach().float().cpu().numpy()
        embedding = fam.image_embedding(loaded.model, out)
        embedding = None if embedding is None else embedding.detach().float().cpu().numpy()
    geometries = [rec.geometries[i] for i in sorted(rec.geometries)]
    captures = []
    for i in range(len(resized)):
        blocks = tuple(
            Block(b, g, rec.arrays[b].attention[i], rec.arrays[b].fused[i], rec.arrays[b].summaries[i])
            for b, g in enumerate(geometries)
        )
        captures.append(
            Capture(
                model_name=loaded.name,
                family=fam.name,
                input_size=hw,
                patch_size=loaded.patch_size,
                stages=build_stages(loaded, geometries, rec.norms, i),
                blocks=blocks,
                image=resized[i],
                logits=None if logits is None else logits[i],
                predictions=() if logits is None else predictions_from_logits(logits[i], loaded.id2label, top_k),
                readout=fam.readout(loaded.config),
                position=loaded.position,
                patch_weights=loaded.patch_weights,
                rollout_note=fam.rollout_note(loaded.config),
                attention_stack=None if rec.stack is None else rec.stack[i, : _stacked(geometries)],
                image_embedding=None if embedding is None else embedding[i],
            )
        )
    return captures


def capture(
    loaded: LoadedModel,
    image: Image.Image,
    *,
    size: int | tuple[int, int] | None = None,
    top_k: int = 5,
    attention_dtype: str = "float16",
    budget_bytes: int = DEFAULT_BUDGET_BYTES,
) -> Capture:
    """Capture one image: see :func:`capture_batch`."""
    return capture_batch(
        loaded, [image], size=size, top_k=top_k, attention_dtype=attention_dtype, budget_bytes=budget_bytes
    )[0]
