"""What a typed hub id's ``config.json`` and weights index may ask for, checked before any weight is downloaded.

The hub's file sizes bound the download, not the model the config builds: a 3,000-layer
config with two layers of weights passes a size check and then allocates 3,000 layers
(and loads 99.9 % random weights). :func:`config_problem` bounds the fields that decide a
model's size, in every tower (``text_config``, ``vision_config`` included), against
:class:`ConfigLimits`, and the parameter memory they imply against the server's model
memory. :func:`check_index` refuses a sharded checkpoint's index whose entries name files
outside the repository (``../``, absolute paths, other folders): it could load another
cached model.

Defaults (:data:`DEFAULT_LIMITS`) sit well above every supported family's largest public
checkpoint (ViT-Huge: 32 layers of width 1280; DINOv2-giant: 40 of 1536; ImageNet-21k:
21,843 classes).

The fields alone do not bound every family (a Swin's ``mlp_ratio`` of 20000 passed them):
:func:`config_footprint` builds the model the config describes on PyTorch's ``meta`` device
(shapes, no memory) and counts its parameters and buffers, whatever fields its family uses; the
policy compares that with the server's model memory before any weight is downloaded.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from vitviz.models.weights_index import INDEX, index_problem

__all__ = [
    "ConfigLimits",
    "DEFAULT_LIMITS",
    "CONFIG_TOO_LARGE",
    "BAD_INDEX",
    "REMOTE_CODE",
    "INDEX",
    "config_problem",
    "config_footprint",
    "index_problem",
]

CONFIG_TOO_LARGE = (
    "'{name}' has a config.json that asks for {what} = {value}, more than this server allows ({limit}). "
    "Choose a smaller checkpoint, or a model from the list."
)
REMOTE_CODE = (
    "'{name}' needs code of its own to load (auto_map in its config.json), and this server never runs a "
    "checkpoint's code. Choose a model from the list."
)
BAD_INDEX = (
    "'{name}' has a weights index (model.safetensors.index.json) {detail}. This server loads only the weights "
    "of the repository itself. Choose a model from the list."
)
_MAX_INDEX_BYTES = 10_000_000
_TOWERS = ("text_config", "vision_config", "backbone_config")


@dataclass(frozen=True)
class ConfigLimits:
    """Upper bounds on the size-deciding fields of one tower of a config."""

    layers: int = 64  # num_hidden_layers, depth, or the sum of depths (hierarchical models)
    width: int = 4096  # hidden_size, embed_dim (and its widest stage), hidden_sizes, projection_dim
    intermediate: int = 16384  # intermediate_size
    heads: int = 64  # num_attention_heads (any stage)
    image_size: int = 2048  # each side
    tokens: int = 16384  # (image_size / patch_size) ** 2
    labels: int = 100_000  # num_labels, id2label
    vocab: int = 500_000  # vocab_size (text towers)
    positions: int = 16384  # max_position_embeddings


DEFAULT_LIMITS = ConfigLimits()


class _TooLarge(Exception):
    def __init__(self, what: str, value: Any, limit: Any) -> None:
        super().__init__(what)
        self.what, self.value, self.limit = what, value, limit


def _ints(value: Any) -> list[int]:
    """An int, or the ints of a list (a per-stage field); anything else gives none."""
    items = value if isinstance(value, (list, tuple)) else [value]
    return [int(v) for v in items if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)]


def _towers(config: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, Mapping[str, Any]]]:
    yield prefix, config
    for key in _TOWERS:
        sub = config.get(key)
        if isinstance(sub, Mapping):
            yield from _towers(sub, f"{prefix}{key}.")


def _at_most(what: str, values: list[int], limit: int) -> None:
    for v in values:
        if v > limit:
            raise _TooLarge(what, v, f"at most {limit:,}")


def _check_tower(prefix: str, c: Mapping[str, Any], limits: ConfigLimits) -> int:
    """Check one tower; returns its rough parameter count (0 where the fields do not say)."""
    for key, value in c.items():  # per-stage lists: a million stages of depth 0 would each be built
        if isinstance(value, (list, tuple)) and len(value) > 4 * limits.layers:
            raise _TooLarge(f"{prefix}{key}", f"{len(value):,} entries", f"at most {4 * limits.layers:,}")
    depth = _ints(c.get("depths")) or _ints(c.get("depth"))
    layers = _ints(c.get("num_hidden_layers"))
    _at_most(f"{prefix}num_hidden_layers", layers, limits.layers)
    for key in ("num_layers", "n_layers", "num_blocks", "n_conv_layers"):  # other families' names (CCT's, ...)
        _at_most(f"{prefix}{key}", _ints(c.get(key)), limits.layers)
    total_depth = sum(depth)
    if total_depth > limits.layers:
        raise _TooLarge(f"{prefix}depths", total_depth, f"at most {limits.layers:,} layers in all")
    widths = [*_ints(c.get("hidden_size")), *_ints(c.get("hidden_sizes")), *_ints(c.get("projection_dim"))]
    embed = _ints(c.get("embed_dim"))
    if embed and len(depth) > 1:  # Swin-style: the width doubles per stage
        embed = [embed[0] * 2 ** (len(depth) - 1)]
    _at_most(f"{prefix}hidden_size", widths + embed, limits.width)
    _at_most(f"{prefix}intermediate_size", _ints(c.get("intermediate_size")), limits.intermediate)
    _at_most(f"{prefix}num_attention_heads", _ints(c.get("num_attention_heads")), limits.heads)
    sides = _ints(c.get("image_size"))
    _at_most(f"{prefix}image_size", sides, limits.image_size)
    patch = [p for p in _ints(c.get("patch_size")) if p > 0]
    if sides and patch:
        tokens = (max(sides) // min(patch)) ** 2
        if tokens > limits.tokens:
            raise _TooLarge(f"{prefix}image_size / patch_size", f"{tokens:,} tokens", f"at most {limits.tokens:,}")
    labels = _ints(c.get("num_labels"))
    id2label = c.get("id2label")
    if isinstance(id2label, Mapping):
        labels.append(len(id2label))
    _at_most(f"{prefix}num_labels", labels, limits.labels)
    _at_most(f"{prefix}vocab_size", _ints(c.get("vocab_size")), limits.vocab)
    _at_most(f"{prefix}max_position_embeddings", _ints(c.get("max_position_embeddings")), limits.positions)
    if layers and _ints(c.get("hidden_size")):
        d = _ints(c.get("hidden_size"))[0]
        inner = (_ints(c.get("intermediate_size")) or [4 * d])[0]
        extra = (max(labels, default=0) + max(_ints(c.get("vocab_size")), default=0)) * d
        return layers[0] * (4 * d * d + 2 * d * inner) + extra
    return 0


def config_problem(
    config: Mapping[str, Any], memory_bytes: int | None, limits: ConfigLimits = DEFAULT_LIMITS
) -> tuple[str, str, str] | None:
    """``(what, value, limit)`` of the first field over its limit, or None when the config fits.

    Every tower is checked; the parameters the towers imply (float32, 4 bytes each) must fit
    in ``memory_bytes`` (the server's model memory) when given.
    """
    try:
        params = sum(_check_tower(prefix, tower, limits) for prefix, tower in _towers(config))
    except _TooLarge as exc:
        return exc.what, f"{exc.value:,}" if isinstance(exc.value, int) else str(exc.value), str(exc.limit)
    if memory_bytes and params * 4 > memory_bytes:
        return (
            "parameters (from its layers and widths)",
            f"about {params * 4 / 2**30:.1f} GiB",
            f"at most {memory_bytes / 2**30:.1f} GiB of model memory",
        )
    return None


def config_footprint(config: Mapping[str, Any]):
    """The parameters and buffers (:class:`vitviz.models.estimate.Footprint`, float32) of the model ``config``
    describes, counted on the meta device: nothing of that size is allocated.

    Call it after :func:`config_problem` passed (the fields bound how many modules are built).

    Raises:
        ValueError: no model can be built from it (an unknown ``model_type``, values its class refuses).
    """
    from transformers import AutoConfig

    from vitviz.models.estimate import footprint
    from vitviz.models.load import model_class_for
    from vitviz.zoo import register

    register()  # CCT, T2T-ViT, DAT: vitviz's own classes
    fields = dict(config)
    model_type = fields.pop("model_type", None)
    try:
        built = AutoConfig.for_model(model_type, **fields)
        return footprint(model_class_for(built), built)
    except Exception as exc:  # whatever the config's values make the classes raise
        raise ValueError(str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__) from None
