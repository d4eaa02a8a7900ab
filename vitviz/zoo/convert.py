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

import argparse
import collections
import json
import re
import shutil
import tempfile
import zipfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from vitviz.errors import VitvizError
from vitviz.safetensors_header import HeaderError, read_header

__all__ = ["Converter", "ConvertError", "official_names", "converter_for", "read_state_dict", "convert"]

SHOWN = 5  # mismatching keys named in a message
# Classes a head trained on each data set has (a converter's notes["dataset"], which official names declare).
DATASET_CLASSES = {"cifar10": 10, "cifar100": 100, "flowers102": 102, "imagenet": 1000}
# Plain-data classes training scripts pickle next to the weights: read as data, never as code. yacs' CfgNode
# (a dict subclass) becomes an OrderedDict, whether or not yacs is installed.
SETTINGS_CLASSES = [argparse.Namespace, (collections.OrderedDict, "yacs.config.CfgNode")]
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


class ConvertError(VitvizError):
    """A checkpoint that cannot be converted; the message says why and nothing was written."""


@dataclass(frozen=True)
class Converter:
    """How one official model name becomes a ``transformers`` model.

    ``config``: builds the config of that name (``num_labels`` given); ``model_class``: the
    ``PreTrainedModel`` to build; ``classifier_key``: the official key of the head's weight,
    whose first dimension gives the number of classes (None: no head);
    ``map_keys``: official state dict -> ours (renames only; identity when the names are kept);
    ``image_size``, ``mean``, ``std``: the input the authors evaluated at; ``shortest_edge``: the short
    side their evaluation resizes the photo to (bicubic) before its centre crop of ``image_size``
    (``floor(image_size / crop_pct)`` in timm's terms; None: ``image_size``, the whole short side). The
    folder written says so (``preprocessor_config.json`` and ``vitviz.json``), so that vitviz shows the
    converted model the authors' crop and it scores like the original (its maps then cover the crop).
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
    shortest_edge: int | None = None


def write_center_crop(
    folder: Path,
    crop: int,
    shortest_edge: int,
    mean: Sequence[float],
    std: Sequence[float],
    *,
    resample: int = 3,
    settings: dict | None = None,
) -> None:
    """Write the original's evaluation as the folder's preprocessing: resize the short side to ``shortest_edge``,
    keep the centre ``crop`` square (``preprocessor_config.json``, a CLIP-style processor), and ask vitviz to
    honour the crop (``vitviz.json``: ``"center_crop": true``, beside any other ``settings``)."""
    from transformers import CLIPImageProcessor

    CLIPImageProcessor(
        size={"shortest_edge": int(shortest_edge)},
        crop_size={"height": int(crop), "width": int(crop)},
        do_center_crop=True,
        image_mean=list(mean),
        image_std=list(std),
        resample=resample,
    ).save_pretrained(folder)
    (folder / "vitviz.json").write_text(json.dumps({**(settings or {}), "center_crop": True}, indent=1) + "\n")


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


def _header_problem(path: Path, exc: HeaderError) -> str:
    if exc.kind == "length":
        return f"{path.name} is not a safetensors file: its header length does not fit the file."
    if exc.kind == "json":
        return f"{path.name} is damaged: its safetensors header is not JSON."
    if exc.kind == "table":
        return f"{path.name} is damaged: its safetensors header is not a table of tensors."
    if exc.kind == "entry":
        return f"{path.name} is damaged: the header entry of {exc.name[:80]} cannot be read."
    if exc.kind == "outside":
        return f"{path.name} is damaged: {exc.name[:80]} {exc} (truncated?)."
    return f"{path.name} is damaged: {exc.name[:80]} {exc}."


def check_safetensors(path: Path) -> None:
    """Refuse a safetensors file whose header or sizes do not add up, before it is read.

    The 8-byte header length must fit in the file, the header must be JSON, and the tensors'
    ``data_offsets`` must tile the data area exactly (no gap, no overlap, nothing after the
    last), each span holding ``prod(shape) * itemsize`` bytes.
    """
    try:
        entries, data = read_header(path)
    except HeaderError as exc:
        raise ConvertError(_header_problem(path, exc)) from None
    spans = [(e.begin, e.end, e.name) for e in entries]
    at = 0
    for begin, end, name in sorted(spans):
        if begin != at:
            raise ConvertError(f"{path.name} is damaged: the tensors' data do not follow each other (at {name[:80]}).")
        at = end
    if at != data:
        raise ConvertError(
            f"{path.name} is damaged: its header describes {at} bytes of tensor data, the file holds {data} "
            "(truncated, or bytes appended)."
        )


def check_archive(path: Path) -> None:
    """Refuse a ``torch.save`` archive (a zip file) with a damaged member: every CRC is checked before loading."""
    if not zipfile.is_zipfile(path):
        return  # the legacy format has no checksums; torch.load reports what it cannot read
    try:
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()
    except (zipfile.BadZipFile, OSError, EOFError, ValueError, NotImplementedError) as exc:
        raise ConvertError(f"{path.name} is damaged: its archive cannot be read ({exc}).") from None
    if bad is not None:
        raise ConvertError(
            f"{path.name} is damaged: the checksum (CRC) of {bad} inside it does not match its bytes. "
            "Download or copy the file again."
        )


def _refusal(exc: BaseException) -> str:
    """What torch's weights-only reader refused, in one line: no terminal colours, no advice to load unsafely."""
    text = _ANSI.sub("", str(exc))
    found = re.search(r"GLOBAL ([\w.]+)", text)
    if found:
        return f"it holds an object of type {found.group(1)}, which only code could rebuild"
    found = re.search(r"WeightsUnpickler error:\s*([^\n]+)", text)
    line = found.group(1) if found else (text.strip().splitlines() or [type(exc).__name__])[0]
    line = re.split(r"\. (?:Please|Re-running|Check)", line)[0][:200].strip()
    if not line or "weights_only" in line or "Weights only" in line or line.startswith("Unsupported operand"):
        return "it is not a PyTorch checkpoint torch.load can read without running code"
    return line


def read_state_dict(path: str | Path) -> dict[str, torch.Tensor]:
    """A checkpoint file -> its flat state dict (tensors only), read without running any code.

    ``.safetensors``: header and sizes checked first (:func:`check_safetensors`); anything
    else: the archive's CRCs checked (:func:`check_archive`), then ``torch.load`` with
    ``weights_only=True``, which also accepts the training settings pickled beside the
    weights (:data:`SETTINGS_CLASSES`, read as data).
    """
    path = Path(path)
    if not path.is_file():
        raise ConvertError(f"{path} is not a file.")
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        check_safetensors(path)
        try:
            return load_file(str(path))
        except Exception as exc:  # a truncated or foreign file
            raise ConvertError(f"{path.name} is not a readable safetensors file: {_refusal(exc)}") from None
    check_archive(path)
    try:
        with torch.serialization.safe_globals(SETTINGS_CLASSES):
            obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # weights_only refuses any pickled object that is not a tensor or a plain container
        raise ConvertError(
            f"{path.name} is not a plain state dict that can be read safely ({_refusal(exc)}). vitviz reads "
            "tensors, plain containers and training settings (argparse.Namespace, yacs CfgNode) and never runs "
            "code from a file: save the model's state_dict() alone and convert that."
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
    dataset = conv.notes.get("dataset")  # the data set the official name was trained on
    expected = DATASET_CLASSES.get(dataset)
    if labels is None and conv.classifier_key in state and expected is not None and num_labels != expected:
        raise ConvertError(
            f"The checkpoint's head has {num_labels} classes, but {name} is the {dataset} model ({expected} "
            "classes): is it a checkpoint of another data set? To convert it anyway, give --labels with one "
            f"name per class ({num_labels} lines). Nothing was written."
        )
    bad = [k for k, t in state.items() if t.is_floating_point() and not bool(torch.isfinite(t).all())]
    if bad:
        raise ConvertError(
            f"The checkpoint has NaN or infinite values in {len(bad)} tensors ({', '.join(bad[:SHOWN])}"
            f"{' ...' if len(bad) > SHOWN else ''}): it is damaged. Nothing was written."
        )
    config = conv.config(num_labels=num_labels)
    if labels is not None:
        config.id2label = dict(enumerate(labels))
        config.label2id = {v: k for k, v in config.id2label.items()}
    model = conv.model_class(config).eval()
    _check(state, model.state_dict(), name)
    model.load_state_dict(state, strict=True)

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        side = conv.image_size[0]  # the official inputs are square
        write_center_crop(tmp, side, conv.shortest_edge or side, conv.mean, conv.std, resample=3)  # bicubic, as timm
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out
