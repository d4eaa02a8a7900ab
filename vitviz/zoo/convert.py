"""``python -m vitviz convert``: an official checkpoint (a plain state dict) -> a folder vitviz loads.

The file is read with ``torch.load(weights_only=True)``: tensors and plain containers
only, no code runs (a pickle that carries objects is refused). Wrappers the authors'
training scripts leave (``{"model": ...}``, ``{"state_dict": ...}``, ``{"state_dict_ema":
...}``, a ``module.`` prefix from DataParallel) are unwrapped. The keys are mapped to
ours, and every key and shape is checked against the architecture the official name
describes; a mismatch is reported with the first offending keys and nothing is
written. The folder gets ``model.safetensors``, ``config.json`` and
``preprocessor_config.json``, written to a temporary folder beside ``out`` and moved
into place only when complete.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from vitviz.errors import VitvizError

__all__ = ["Converter", "ConvertError", "official_names", "converter_for", "read_state_dict", "convert"]

SHOWN = 5  # mismatching keys named in a message


class ConvertError(VitvizError):
    """A checkpoint that cannot be converted; the message says why and nothing was written."""


@dataclass(frozen=True)
class Converter:
    """How one official model name becomes a ``transformers`` model.

    ``config``: builds the config of that name (``num_labels`` given); ``model_class``: the
    ``PreTrainedModel`` to build; ``classifier_key``: the official key of the head's weight,
    whose first dimension gives the number of classes (None: no head);
    ``map_keys``: official state dict -> ours (renames only; identity when the names are kept);
    ``image_size``, ``mean``, ``std``: the input the authors evaluated at (vitviz resizes the whole
    image to it rather than centre-cropping, so that every patch of the view is on the image).
    """

    name: str
    config: Callable[..., Any]
    model_class: type
    classifier_key: str | None
    map_keys: Callable[[dict[str, torch.Tensor]], dict[str, torch.Tensor]] = lambda sd: sd
    image_size: tuple[int, int] = (224, 224)
    mean: tuple[float, float, float] = (0.485, 0.456, 0.406)
    std: tuple[float, float, float] = (0.229, 0.224, 0.225)
    notes: dict = field(default_factory=dict)


def _registry() -> dict[str, Converter]:
    from vitviz.zoo import modules

    return {name: conv for m in modules() for name, conv in getattr(m, "CONVERTERS", {}).items()}


def official_names() -> tuple[str, ...]:
    """Every official model name ``convert`` knows, sorted."""
    return tuple(sorted(_registry()))


def converter_for(name: str) -> Converter:
    registry = _registry()
    if name not in registry:
        raise ConvertError(f"Unknown architecture '{name}'. Known official names: {', '.join(sorted(registry))}.")
    return registry[name]


def read_state_dict(path: str | Path) -> dict[str, torch.Tensor]:
    """A checkpoint file -> its flat state dict (tensors only), read without running any code."""
    path = Path(path)
    if not path.is_file():
        raise ConvertError(f"{path} is not a file.")
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        try:
            return load_file(str(path))
        except Exception as exc:  # a truncated or foreign file
            raise ConvertError(f"{path.name} is not a readable safetensors file: {exc}") from None
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # weights_only refuses any pickled object that is not a tensor or a plain container
        why = (str(exc).splitlines() or [type(exc).__name__])[0][:300]
        raise ConvertError(
            f"{path.name} is not a plain state dict that can be read safely (torch.load with weights_only=True "
            f"refused it: {why}). Save the model's state_dict() alone and try again."
        ) from None
    for key in ("state_dict_ema", "model_ema", "model", "state_dict", "module"):
        if isinstance(obj, Mapping) and isinstance(obj.get(key), Mapping):
            obj = obj[key]
            break
    if not isinstance(obj, Mapping) or not obj:
        raise ConvertError(f"{path.name} holds no state dict (found {type(obj).__name__}).")
    tensors = {k: v for k, v in obj.items() if isinstance(v, torch.Tensor)}
    if not tensors:
        raise ConvertError(f"{path.name} holds no tensors.")
    if all(k.startswith("module.") for k in tensors):
        tensors = {k[len("module.") :]: v for k, v in tensors.items()}
    return tensors


def _check(ours: Mapping[str, torch.Tensor], want: Mapping[str, torch.Tensor], name: str) -> None:
    missing = [k for k in want if k not in ours]
    extra = [k for k in ours if k not in want]
    shapes = [
        f"{k}: {tuple(ours[k].shape)} in the file, {tuple(want[k].shape)} in {name}"
        for k in want
        if k in ours and ours[k].shape != want[k].shape
    ]
    problems = []
    for what, keys in (("missing", missing), ("unexpected", extra), ("of another shape", shapes)):
        if keys:
            more = f" and {len(keys) - SHOWN} more" if len(keys) > SHOWN else ""
            problems.append(f"{len(keys)} keys {what}: {'; '.join(keys[:SHOWN])}{more}")
    if problems:
        raise ConvertError(
            f"The checkpoint does not fit {name}: " + ". ".join(problems) + ". Is it a checkpoint of another "
            "architecture or size? Nothing was written."
        )


def convert(
    name: str, checkpoint: str | Path, out: str | Path, *, labels: list[str] | None = None, overwrite: bool = False
) -> Path:
    """Convert an official checkpoint of model ``name`` into a folder ``out``; returns ``out``.

    Raises :class:`ConvertError` (nothing written) on an unknown name, an unsafe or
    unreadable file, or keys and shapes that do not fit.
    """
    conv = converter_for(name)
    out = Path(out)
    if out.exists() and any(out.iterdir()) and not overwrite:
        raise ConvertError(f"{out} exists and is not empty; choose another --out.")
    state = conv.map_keys(read_state_dict(checkpoint))
    num_labels = int(state[conv.classifier_key].shape[0]) if conv.classifier_key in state else 1000
    if labels is not None and len(labels) != num_labels:
        raise ConvertError(f"{len(labels)} labels given, the checkpoint's head has {num_labels} classes.")
    config = conv.config(num_labels=num_labels)
    if labels is not None:
        config.id2label = dict(enumerate(labels))
        config.label2id = {v: k for k, v in config.id2label.items()}
    model = conv.model_class(config).eval()
    _check(state, model.state_dict(), name)
    model.load_state_dict(state, strict=True)

    from transformers import ViTImageProcessor

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        h, w = conv.image_size
        ViTImageProcessor(
            size={"height": h, "width": w},
            image_mean=list(conv.mean),
            image_std=list(conv.std),
            resample=3,  # bicubic, as timm-style evaluation does
        ).save_pretrained(tmp)
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out
