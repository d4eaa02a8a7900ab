"""One forward pass -> one immutable :class:`Capture` of everything the views need.

Attention comes from ``output_attentions`` of an eager-attention model, so a call
registers nothing on the shared model and leaves no state behind: many sessions
and threads can capture from one cached model at once.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from PIL import Image

from vitviz.errors import BudgetError, CaptureError
from vitviz.models.load import LoadedModel

__all__ = [
    "Prediction",
    "Capture",
    "DEFAULT_BUDGET_BYTES",
    "input_size_for",
    "estimate_capture_bytes",
    "check_budget",
    "token_layout",
    "predictions_from_logits",
    "preprocess",
    "forward",
    "capture",
    "capture_batch",
]

# What one capture may hold (attention of all layers and heads); VITVIZ_MEMORY_BUDGET_MB overrides 2 GiB.
DEFAULT_BUDGET_BYTES = int(os.environ.get("VITVIZ_MEMORY_BUDGET_MB", "2048")) * 2**20


@dataclass(frozen=True)
class Prediction:
    index: int
    label: str
    probability: float  # softmax over all classes
    logit: float


def _frozen(a: np.ndarray | None) -> np.ndarray | None:
    if a is not None:
        a.setflags(write=False)
    return a


@dataclass(frozen=True, eq=False)
class Capture:
    """What one forward pass saw. Arrays are read-only.

    Shapes: ``attentions`` (L, H, T, T) with T = P + gh*gw; ``image`` (h, w, 3) uint8,
    the resized input the model saw; ``logits`` (C,) or None for backbones;
    ``position_embeddings`` (G*G, D) patch rows on the native grid ``position_grid``;
    ``token_norms`` (L+1, T) L2 norms of the residual stream (embeddings, then each
    layer's output); ``patch_weights`` (D, C, p, p).
    """

    model_name: str
    family: str
    input_size: tuple[int, int]
    patch_size: int
    grid: tuple[int, int]
    token_kinds: tuple[str, ...]
    attentions: np.ndarray = field(repr=False)
    image: np.ndarray = field(repr=False)
    logits: np.ndarray | None = field(repr=False)
    predictions: tuple[Prediction, ...]
    position_embeddings: np.ndarray | None = field(repr=False)
    position_grid: tuple[int, int] | None
    position_note: str
    token_norms: np.ndarray = field(repr=False)
    patch_weights: np.ndarray = field(repr=False)

    def __post_init__(self) -> None:
        for name in ("attentions", "image", "logits", "position_embeddings", "token_norms", "patch_weights"):
            _frozen(getattr(self, name))

    @property
    def num_prefix_tokens(self) -> int:
        return len(self.token_kinds) - self.grid[0] * self.grid[1]

    @property
    def prefix_kinds(self) -> tuple[str, ...]:
        return self.token_kinds[: self.num_prefix_tokens]

    @property
    def num_layers(self) -> int:
        return self.attentions.shape[0]

    @property
    def num_heads(self) -> int:
        return self.attentions.shape[1]

    @property
    def num_tokens(self) -> int:
        return self.attentions.shape[-1]

    @property
    def attention_precision(self) -> str:
        return str(self.attentions.dtype)

    @property
    def nbytes(self) -> int:
        """Bytes this image's arrays hold (position embeddings and patch weights are the model's, shared)."""
        return sum(a.nbytes for a in (self.attentions, self.image, self.logits, self.token_norms) if a is not None)

    def token_label(self, index: int) -> str:
        """``CLS``, ``DIST``, ``REG1``, or ``patch (row, col)`` for a sequence position."""
        p = self.num_prefix_tokens
        if index < p:
            return self.token_kinds[index]
        row, col = divmod(index - p, self.grid[1])
        return f"patch ({row}, {col})"


def input_size_for(loaded: LoadedModel, size: int | tuple[int, int] | None = None) -> tuple[int, int]:
    """(h, w) the model will see: the processor's default, or ``size`` snapped to whole patches."""
    if size is None:
        h, w = loaded.default_size
    elif isinstance(size, int):
        h = w = size
    else:
        h, w = size
    p = loaded.patch_size
    h, w = max(p, round(h / p) * p), max(p, round(w / p) * p)
    return int(h), int(w)


def estimate_capture_bytes(
    num_layers: int, num_heads: int, num_tokens: int, *, batch: int = 1, gradients: bool = False, itemsize: int = 4
) -> int:
    """Memory the attention capture holds: L x H x T^2 values per image, doubled with gradients."""
    return num_layers * num_heads * num_tokens**2 * itemsize * batch * (2 if gradients else 1)


def token_layout(loaded: LoadedModel, hw: tuple[int, int]) -> tuple[tuple[str, ...], tuple[int, int]]:
    """(prefix token kinds, patch grid (gh, gw)) of ``loaded`` at input size ``hw``."""
    return loaded.family.prefix_kinds(loaded.config), (hw[0] // loaded.patch_size, hw[1] // loaded.patch_size)


def _size(n: int) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


def check_budget(loaded: LoadedModel, hw: tuple[int, int], *, batch: int, gradients: bool, budget: int) -> None:
    cfg = loaded.config
    prefix, (gh, gw) = token_layout(loaded, hw)
    need = estimate_capture_bytes(
        cfg.num_hidden_layers, cfg.num_attention_heads, len(prefix) + gh * gw, batch=batch, gradients=gradients
    )
    if need > budget:
        raise BudgetError(
            f"An input of {hw[1]} x {hw[0]} px needs about {_size(need)} for attention maps"
            f"{' and their gradients' if gradients else ''}, over the {_size(budget)} budget "
            f"(VITVIZ_MEMORY_BUDGET_MB). Choose a smaller input size (e.g. {loaded.default_size[1]} px)."
        )


def preprocess(
    loaded: LoadedModel, images: Sequence[Image.Image], hw: tuple[int, int]
) -> tuple[torch.Tensor, np.ndarray]:
    """Resize to ``hw`` and normalise as the model's image processor does.

    No centre crop: the model sees the whole image, so maps overlay it exactly.
    Returns pixel values ``(B, 3, h, w)`` on the model's device and the resized
    uint8 images ``(B, h, w, 3)``.
    """
    h, w = hw
    resized = np.stack([np.asarray(img.convert("RGB").resize((w, h), loaded.resample)) for img in images])
    x = resized.astype(np.float32) * loaded.rescale_factor
    x = (x - np.asarray(loaded.image_mean, np.float32)) / np.asarray(loaded.image_std, np.float32)
    pixels = torch.from_numpy(x).permute(0, 3, 1, 2).contiguous()
    return pixels.to(device=loaded.device, dtype=loaded.dtype), resized


def forward(loaded: LoadedModel, pixels: torch.Tensor):
    """The model's forward pass with attentions and hidden states; grad mode is the caller's."""
    kwargs = {"output_attentions": True, "output_hidden_states": True}
    if loaded.family.interpolate_kwarg:
        kwargs["interpolate_pos_encoding"] = True
    out = loaded.model(pixel_values=pixels, **kwargs)
    if not out.attentions or any(a is None for a in out.attentions):
        raise CaptureError(
            f"'{loaded.name}' returned no attention weights: it must run with eager attention "
            "(fused SDPA / flash kernels never materialise them)."
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


def capture_batch(
    loaded: LoadedModel,
    images: Sequence[Image.Image],
    *,
    size: int | tuple[int, int] | None = None,
    top_k: int = 5,
    attention_dtype: str = "float16",
    budget_bytes: int = DEFAULT_BUDGET_BYTES,
) -> list[Capture]:
    """Capture a batch of images at one input size in a single forward pass.

    ``attention_dtype`` float16 (default) halves the record; attention weights lie in
    [0, 1], where float16 keeps about 3 significant digits. Use float32 for parity work.
    """
    if not images:
        return []
    hw = input_size_for(loaded, size)
    check_budget(loaded, hw, batch=len(images), gradients=False, budget=budget_bytes)
    pixels, resized = preprocess(loaded, images, hw)
    with torch.inference_mode():
        out = forward(loaded, pixels)
        norms = torch.stack([h.float().norm(dim=-1) for h in out.hidden_states], dim=1).cpu().numpy()
        logits = out.logits.float().cpu().numpy() if loaded.has_classifier else None
        layers = list(out.attentions)
        del out  # from here each layer's float32 weights are freed as soon as they are converted
        attn = np.empty((layers[0].shape[0], len(layers), *layers[0].shape[1:]), dtype=attention_dtype)
        for i in range(len(layers)):
            attn[:, i] = layers[i].to(getattr(torch, attention_dtype)).cpu().numpy()  # torch casts faster
            layers[i] = None

    fam = loaded.family
    prefix, grid = token_layout(loaded, hw)
    if attn.shape[-1] != len(prefix) + grid[0] * grid[1]:
        raise CaptureError(
            f"Expected {len(prefix)} prefix tokens + {grid[0]} x {grid[1]} patches, got {attn.shape[-1]} tokens."
        )
    kinds = prefix + ("patch",) * (grid[0] * grid[1])
    return [
        Capture(
            model_name=loaded.name,
            family=fam.name,
            input_size=hw,
            patch_size=loaded.patch_size,
            grid=grid,
            token_kinds=kinds,
            attentions=attn[i],
            image=resized[i],
            logits=None if logits is None else logits[i],
            predictions=() if logits is None else predictions_from_logits(logits[i], loaded.id2label, top_k),
            position_embeddings=loaded.position_embeddings,
            position_grid=loaded.position_grid,
            position_note=loaded.position_note,
            token_norms=norms[i],
            patch_weights=loaded.patch_weights,
        )
        for i in range(len(images))
    ]


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
