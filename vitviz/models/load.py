"""Load a ViT-family model by hub id, from the local Hugging Face cache, or from a folder.

Rules: eager attention (the only kind that returns weights), never
``trust_remote_code``, safetensors unless the caller opts in to pickle, and no
20-second hang when the hub is out of reach: an uncached hub id fails fast with a
message that says how to fix it.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

import numpy as np
import torch

from vitviz.errors import CaptureError, ModelLoadError
from vitviz.models.bundled import bundled
from vitviz.models.families import Family, family_for
from vitviz.models.hooks import install
from vitviz.models.weights_index import INDEX, index_problem
from vitviz.models.zeroshot import TextTower, text_tower, text_tower_note
from vitviz.record import PositionInfo

__all__ = [
    "LoadedModel",
    "DEMO_NAME",
    "load_model",
    "model_class_for",
    "pick_device",
    "resolve_source",
    "parse_model_name",
]

DEMO_NAME = "demo"
_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}(/[A-Za-z0-9][A-Za-z0-9._-]{0,95})?$")
_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
_SAFE_WEIGHTS = ("model.safetensors", "model.safetensors.index.json")
_PICKLE_WEIGHTS = ("pytorch_model.bin", "pytorch_model.bin.index.json")


@dataclass(frozen=True)
class LoadedModel:
    """A model ready for capture. Shared between sessions: nothing here changes after loading."""

    name: str  # what the user asked for
    source: str  # local folder or hub id actually loaded
    model: torch.nn.Module = field(repr=False)
    family: Family
    device: torch.device
    dtype: torch.dtype
    patch_size: int
    default_size: tuple[int, int]  # (height, width) the processor uses
    image_mean: tuple[float, ...]
    image_std: tuple[float, ...]
    rescale_factor: float
    resample: int  # PIL resampling filter of the processor
    channel_order: tuple[int, int, int]  # (2, 1, 0) where the processor feeds BGR (MobileViT)
    id2label: dict[int, str] | None  # None for backbones without a classifier
    # Model-level arrays, computed once and shared read-only by every capture:
    position: PositionInfo  # absolute tables per stage, relative biases, or a note saying why none
    patch_weights: np.ndarray | None = field(repr=False)  # (D, C, k, k) first convolution
    text: TextTower | None = field(default=None, repr=False)  # two-tower models: labels a user types
    text_note: str = ""  # a text tower without its tokenizer: why there are no zero-shot labels
    # (crop side, shortest edge) where the folder asks for its original's centre crop (``vitviz.json``:
    # ``"center_crop": true``, as vitviz's converters write): the short side is resized to ``shortest edge`` and
    # the centre ``crop side`` square kept (scaled alike at other input sizes). None: the whole image, resized.
    center_crop: tuple[int, int] | None = None

    @property
    def config(self):
        return self.model.config

    @property
    def position_embeddings(self) -> np.ndarray | None:
        """``(G*G, D)`` patch rows of the first absolute position table on its native grid, or None."""
        return self.position.tables[0].embeddings if self.position.tables else None

    @property
    def position_grid(self) -> tuple[int, int] | None:
        return self.position.tables[0].grid if self.position.tables else None

    @property
    def position_note(self) -> str:
        return self.position.note

    @property
    def base_model(self) -> torch.nn.Module:
        return self.model.base_model

    @property
    def has_classifier(self) -> bool:
        return self.id2label is not None

    @property
    def no_classes(self) -> str:
        """Why the model scores no classes: its text tower lacks a tokenizer, or it is a backbone without a classifier."""
        return self.text_note or f"'{self.name}' is a backbone without a classifier."

    @property
    def zero_shot(self) -> bool:
        """Whether the model scores labels a user types (it has a text tower and a tokenizer)."""
        return self.text is not None


def pick_device(prefer: str | None = None) -> torch.device:
    """``prefer`` if given, else CUDA, else Apple MPS, else CPU."""
    if prefer:
        try:
            dev = torch.device(prefer)
        except (RuntimeError, ValueError, TypeError):
            raise ModelLoadError(f"Unknown device '{str(prefer)[:40]}': choose cuda, mps or cpu.") from None
        if dev.type == "cuda" and not torch.cuda.is_available():
            raise ModelLoadError("CUDA is not available on this machine: choose cpu, or leave the device unset.")
        if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ModelLoadError(f"There is no CUDA device {dev.index} (this machine has {torch.cuda.device_count()}).")
        mps = getattr(torch.backends, "mps", None)
        if dev.type == "mps" and not (mps is not None and mps.is_available()):
            raise ModelLoadError("Apple MPS is not available on this machine: choose cpu, or leave the device unset.")
        if dev.type not in ("cpu", "cuda", "mps"):
            raise ModelLoadError(f"Device '{str(prefer)[:40]}' is not supported: choose cuda, mps or cpu.")
        return dev
    if torch.cuda.is_available():
        return torch.device("cuda")
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def _is_dir(text: str) -> bool:
    """Whether ``text`` names a folder; False for names the file system cannot take (too long, NUL bytes)."""
    try:
        return Path(text).expanduser().is_dir()
    except (OSError, ValueError):
        return False


def parse_model_name(name: str) -> str:
    """Strip and validate a model field: a local folder, ``demo`` or a hub id ``owner/name``.

    Raises :class:`ModelLoadError` before anything is loaded when it is neither.
    """
    text = (name or "").strip()
    if not text:
        raise ModelLoadError("No model given: type a Hugging Face model id (owner/name), a local folder, or 'demo'.")
    if text in bundled() or _is_dir(text):
        return text
    names = ", ".join(bundled())
    near = [n for n in bundled() if n.lower() == text.lower()]
    if near:  # "Demo" would otherwise be looked up on the hub, with no word of the bundled names
        raise ModelLoadError(
            f"'{text[:120]}' is not a model vitviz knows: did you mean '{near[0]}'? The bundled "
            f"models are {names} (names are lower case)."
        )
    if _HUB_ID.match(text) and ".." not in text:
        return text
    raise ModelLoadError(
        f"'{text[:120]}' is neither an existing local folder nor a Hugging Face model id like "
        f"'google/vit-base-patch16-224'. Check the spelling, or use a bundled model: {names}."
    )


def resolve_source(name: str) -> tuple[str, bool]:
    """(where to load from, is it a local folder)."""
    text = parse_model_name(name)
    if text in bundled():
        return str(bundled()[text]), True
    if _is_dir(text):
        return str(Path(text).expanduser().resolve()), True
    return text, False


def _hub_reachable(timeout: float) -> bool:
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in {"1", "true", "yes", "on"}:
        return False
    url = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        with socket.create_connection((url.hostname or "huggingface.co", port), timeout=timeout):
            return True
    except OSError:
        return False


def _check_local_weights(folder: Path, allow_pickle: bool) -> bool:
    """Return whether to load safetensors; refuse pickle-only folders unless allowed."""
    if not (folder / "config.json").is_file():
        raise ModelLoadError(f"'{folder}' has no config.json: point to a folder written by save_pretrained.")
    if any((folder / f).is_file() for f in _SAFE_WEIGHTS):
        index = folder / INDEX
        if index.is_file():
            try:
                why = index_problem(index.read_text(encoding="utf-8"), {p.name for p in folder.glob("*.safetensors")})
            except (OSError, UnicodeDecodeError):
                why = "that cannot be read"
            if why is not None:
                raise ModelLoadError(
                    f"'{folder}' has a weights index ({INDEX}) {why}; vitviz loads only its own files."
                )
        return True
    if any((folder / f).is_file() for f in _PICKLE_WEIGHTS):
        if allow_pickle:
            return False
        raise ModelLoadError(
            f"'{folder}' holds only pickle weights (pytorch_model.bin), which can run arbitrary code when loaded. "
            "Convert them to safetensors, or opt in explicitly (allow_pickle=True / --allow-pickle) if you trust the source."
        )
    raise ModelLoadError(f"'{folder}' has no model weights (model.safetensors).")


# Files in which transformers looks for ``auto_map`` (code shipped with a checkpoint).
_CODE_CONFIGS = (
    "config.json",
    "preprocessor_config.json",
    "processor_config.json",
    "image_processor_config.json",
    "feature_extractor_config.json",
    "tokenizer_config.json",
)
_MAX_CONFIG_BYTES = 10_000_000


def _config_files(source: str, local: bool, hub_kwargs: dict) -> list[Path]:
    """The configuration files of ``source`` present here (a folder, or the hub cache after the config check)."""
    if local:
        return [Path(source) / f for f in _CODE_CONFIGS if (Path(source) / f).is_file()]
    from transformers.utils import cached_file

    found = []
    for f in _CODE_CONFIGS:
        try:
            path = cached_file(
                source,
                f,
                _raise_exceptions_for_missing_entries=False,
                _raise_exceptions_for_connection_errors=False,
                **hub_kwargs,
            )
        except OSError:
            path = None
        if path:
            found.append(Path(path))
    return found


def _refuse_remote_code(name: str, files: list[Path]) -> None:
    """Refuse a checkpoint whose configuration names code of its own (``auto_map``): vitviz never runs it.

    Without this, ``transformers`` asks "Do you wish to run the custom code? [y/N]" on the
    terminal (and blocks a server's worker there); ``trust_remote_code=False`` on every call
    is the second line of defence.
    """
    import json

    for path in files:
        try:
            if path.stat().st_size > _MAX_CONFIG_BYTES:
                raise ModelLoadError(f"{path.name} of '{name}' is larger than 10 MB: not a configuration file.")
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError):
            continue  # unreadable: transformers reports it below
        if isinstance(data, dict) and "auto_map" in data:
            raise ModelLoadError(
                f"'{name}' asks to run code shipped with it (auto_map in {path.name}); vitviz never runs a "
                "checkpoint's own code. Use a checkpoint of an architecture transformers provides."
            )


@contextlib.contextmanager
def _quiet_transformers():
    """transformers' own load report (coloured, many lines) and its "Loading weights" bar off while loading:
    vitviz says what matters itself (:func:`_refuse_incomplete`), and the bar is noise on every command and, in
    a notebook, a TqdmWarning (the weights of a ViT load in a second or two). The hub's download bars stay as they
    were: a download is the long part of a load. Process-wide; two loads at once may leave it at errors only and
    the bar off."""
    from huggingface_hub import utils as hub_utils
    from transformers.utils import logging as hf_logging

    before = hf_logging.get_verbosity()
    bar = hf_logging.is_progress_bar_enabled()
    downloads = not hub_utils.are_progress_bars_disabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()  # transformers' bar, and the hub's with it:
    if downloads:
        hub_utils.enable_progress_bars()  # the download bars come back
    try:
        yield
    finally:
        hf_logging.set_verbosity(before)
        if bar:
            hf_logging.enable_progress_bar()  # the hub's too:
            if not downloads:
                hub_utils.disable_progress_bars()  # as they were


_SHOWN = 3  # keys named in a message
_MAX_MISSING_SHARE = 0.01  # of the parameters; a missing layer is refused whatever its share
_LAYER_KEY = re.compile(r"\.\d+\.")  # ...layer.7.attention...: a weight of one of the repeated blocks


def _refuse_incomplete(name: str, model: torch.nn.Module, missing_keys) -> None:
    """Refuse a checkpoint whose config promises weights it does not hold (left randomly initialised).

    A missing weight of a repeated block (a key with a layer index), or missing weights making
    up more than 1 % of the parameters, is refused; a few head or pooler weights are not.
    """
    if not missing_keys:
        return
    state = model.state_dict()
    wanted = set(missing_keys)
    missing = [k for k in state if k in wanted] + sorted(wanted.difference(state))  # the model's order
    total = sum(int(t.numel()) for t in state.values()) or 1
    lost = sum(int(state[k].numel()) for k in missing if k in state)
    layers = [k for k in missing if _LAYER_KEY.search(k)]
    if not layers and lost <= _MAX_MISSING_SHARE * total:
        return
    shown = ", ".join((layers or missing)[:_SHOWN])
    depth = getattr(model.config, "num_hidden_layers", None)
    promise = f" (its config promises {depth} layers)" if isinstance(depth, int) else ""
    raise ModelLoadError(
        f"'{name}' is incomplete: its weights lack {len(missing)} of the {len(state)} tensors the model "
        f"needs{promise}, {100 * lost / total:.2f} % of the parameters (e.g. {shown}). They would be random; "
        "use a checkpoint whose config.json matches its weights."
    )


def _refuse_non_finite(name: str, model: torch.nn.Module) -> None:
    """Refuse weights holding NaN or infinity, naming the first tensors that do."""
    bad = [
        k
        for k, t in model.state_dict().items()
        if (t.is_floating_point() or t.is_complex()) and not bool(torch.isfinite(t).all())
    ]
    if bad:
        more = f" and {len(bad) - _SHOWN} more" if len(bad) > _SHOWN else ""
        raise ModelLoadError(
            f"'{name}' has weights that are NaN or infinite in {len(bad)} tensors ({', '.join(bad[:_SHOWN])}{more}): "
            "the checkpoint is damaged. Use another copy of it."
        )


def _weight_files(source: str, local: bool, hub_kwargs: dict) -> list[Path] | None:
    """The safetensors files ``from_pretrained`` reads for ``source`` (a folder's own, or a hub id's from the cache,
    fetched here when missing: the load reads the same files next); None where there are none (pickle weights)."""
    if local:
        folder = Path(source)
        if (folder / "model.safetensors").is_file():
            return [folder / "model.safetensors"]
        if (folder / INDEX).is_file():  # its entries were checked by _check_local_weights: this folder's own files
            import json

            try:
                shards = json.loads((folder / INDEX).read_text(encoding="utf-8"))["weight_map"].values()
            except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError):
                return None
            return [folder / name for name in sorted(set(shards))]
        return None
    from transformers.utils import cached_file

    def fetch(name: str) -> str | None:
        try:
            return cached_file(
                source,
                name,
                _raise_exceptions_for_missing_entries=False,
                _raise_exceptions_for_connection_errors=False,
                **hub_kwargs,
            )
        except OSError:
            return None

    single = fetch("model.safetensors")
    if single:
        return [Path(single)]
    index = fetch(INDEX)
    if not index:
        return None
    import json

    try:
        shards = sorted(set(json.loads(Path(index).read_text(encoding="utf-8"))["weight_map"].values()))
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError):
        return None
    if index_problem(Path(index).read_text(encoding="utf-8"), set(shards)) is not None:
        return None  # from_pretrained reports it
    paths = [fetch(name) for name in shards]
    return None if not all(paths) else [Path(p) for p in paths]


def _refuse_oversized(name: str, config, files: list[Path] | None, dtype: torch.dtype, max_bytes: int | None) -> None:
    """Refuse a config whose model would not fit ``max_bytes``, or would hold more than its weights, before it is
    built (:mod:`vitviz.models.estimate`: the model on the meta device, the weights from their headers)."""
    from vitviz.models.estimate import checkpoint_elements, footprint, footprint_problem

    try:
        need = footprint(_auto_class(config), config, dtype)
    except Exception as exc:  # a config the model class cannot be built from
        why = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
        raise ModelLoadError(f"'{name}' has a configuration no model can be built from: {why}") from None
    try:
        held = checkpoint_elements(files) if files else None
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"'{name}' has damaged weights ({exc}); use another copy of the checkpoint.") from None
    problem = footprint_problem(need, held, max_bytes=max_bytes)
    if problem:
        raise ModelLoadError(
            f"'{name}' is refused before loading: its config.json {problem}. Use a checkpoint whose config.json "
            "matches its weights."
        )


def _auto_class(config):
    """The class the checkpoint declares (``architectures``) when it is a transformers class for this config.

    So a ``CLIPVisionModelWithProjection`` keeps its projection; otherwise the Auto
    class for image classification or the base model. Only classes of the installed
    ``transformers`` are considered: a config never names code to run.
    """
    import transformers
    from transformers import AutoModel, AutoModelForImageClassification

    archs = getattr(config, "architectures", None) or []
    for arch in archs:
        cls = getattr(transformers, str(arch), None)
        if isinstance(cls, type) and getattr(cls, "config_class", None) is type(config):
            return cls
    if any("ForImageClassification" in a for a in archs):
        return AutoModelForImageClassification
    return AutoModel


model_class_for = _auto_class  # the class load_model builds for a config (public name, for size estimates)


def _class_names(config) -> dict[int, str]:
    """A name for every logit: ``id2label`` where it has one, ``class i`` elsewhere.

    Some configs keep ``num_labels`` (what the classifier outputs) apart from a
    shorter ``id2label`` (PvT's does), so the logits, not the label table, count.
    """
    names = {int(k): str(v) for k, v in (config.id2label or {}).items()}
    count = max(int(getattr(config, "num_labels", 0) or 0), len(names))
    return {i: names.get(i, f"class {i}") for i in range(count)}


@dataclass(frozen=True)
class _Preprocessing:
    size: tuple[int, int]
    mean: tuple[float, ...] = (0.5, 0.5, 0.5)
    std: tuple[float, ...] = (0.5, 0.5, 0.5)
    rescale: float = 1 / 255
    resample: int = 2  # bilinear
    channel_order: tuple[int, int, int] = (0, 1, 2)
    center_crop: tuple[int, int] | None = None  # (crop side, shortest edge): see LoadedModel


def _processor_settings(source: str, config, hub_kwargs: dict) -> _Preprocessing:
    """What the model's image processor does to pixels (its size, normalisation, channel order), else defaults.

    A processor that does not normalise (MobileViT) gets mean 0 and std 1; one that
    flips the channel order (MobileViT: BGR) gets ``channel_order`` (2, 1, 0).
    """
    from transformers import AutoImageProcessor

    size = getattr(config, "image_size", 224)  # an int, or (h, w) in some configs (PvT v2)
    default = _Preprocessing(
        (int(size[0]), int(size[1])) if isinstance(size, (list, tuple)) else (int(size), int(size))
    )
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            proc = AutoImageProcessor.from_pretrained(source, trust_remote_code=False, **hub_kwargs)
    except Exception:  # no preprocessor_config.json: keep the ViT defaults
        return default

    def _hw(s) -> tuple[int, int] | None:
        s = dict(s or {})
        if "height" in s and "width" in s:
            return int(s["height"]), int(s["width"])
        if "shortest_edge" in s:
            return int(s["shortest_edge"]), int(s["shortest_edge"])
        return None

    crop = _hw(getattr(proc, "crop_size", None)) if getattr(proc, "do_center_crop", False) else None
    normalise = bool(getattr(proc, "do_normalize", True))  # MobileViT leaves it unset: no normalisation
    mean = tuple(float(v) for v in (getattr(proc, "image_mean", None) or default.mean)) if normalise else (0.0,) * 3
    std = tuple(float(v) for v in (getattr(proc, "image_std", None) or default.std)) if normalise else (1.0,) * 3
    rescale = float(getattr(proc, "rescale_factor", default.rescale) or default.rescale)
    res = getattr(proc, "resample", default.resample)
    return _Preprocessing(
        center_crop=_center_crop(source, proc, crop),
        size=crop or _hw(getattr(proc, "size", None)) or default.size,
        mean=mean,
        std=std,
        rescale=rescale if getattr(proc, "do_rescale", True) is not False else 1.0,
        resample=int(getattr(res, "value", res) if res is not None else default.resample),
        channel_order=(2, 1, 0) if getattr(proc, "do_flip_channel_order", False) else (0, 1, 2),
    )


def _center_crop(source: str, proc, crop: tuple[int, int] | None) -> tuple[int, int] | None:
    """(crop side, shortest edge) when the folder's ``vitviz.json`` asks for its processor's centre crop, else None.

    vitviz shows the whole image unless a folder asks (its maps then cover the crop only): a converted checkpoint
    scores like its original only with the original's crop. The processor must resize the shortest edge and crop
    a square (CLIP's and timm's evaluation); anything else is refused rather than approximated.
    """
    path = Path(source) / "vitviz.json"
    try:
        wanted = path.is_file() and json.loads(path.read_text(encoding="utf-8")).get("center_crop") is True
    except (OSError, ValueError, AttributeError):
        wanted = False
    if not wanted:
        return None
    size = dict(getattr(proc, "size", None) or {})
    if crop is None or crop[0] != crop[1] or "shortest_edge" not in size or int(size["shortest_edge"]) < crop[0]:
        raise ModelLoadError(
            f"'{source}' asks for a centre crop (vitviz.json), but its preprocessor_config.json does not resize the "
            "shortest edge and crop a square of at most that side (do_center_crop, size.shortest_edge, crop_size)."
        )
    return int(crop[0]), int(size["shortest_edge"])


def load_model(
    name: str,
    *,
    device: str | torch.device | None = None,
    dtype: str = "float32",
    allow_pickle: bool = False,
    probe_timeout: float = 1.5,
    max_bytes: int | None = None,
) -> LoadedModel:
    """Load ``name`` (``demo``, a local folder or a hub id) for capture.

    Args:
        device: ``cuda``, ``mps``, ``cpu`` or None for the best available.
        dtype: ``float32`` (default), or ``float16`` / ``bfloat16`` on a GPU.
        allow_pickle: accept checkpoints that only have pickle weights.
        probe_timeout: seconds to wait for the hub before failing an uncached id.
        max_bytes: the memory the model's parameters and buffers may take (None: no limit), checked from the
            config before anything is built; so is a config promising more parameters than its weights hold.

    Raises:
        ModelLoadError: missing, unreachable, unsafe or broken checkpoints.
        UnsupportedModelError: checkpoints of families other than ViT, DeiT, DINO(v2), BEiT.
    """
    from transformers import AutoConfig

    from vitviz.zoo import register

    register()  # CCT, T2T-ViT, DAT: our own classes, registered with the Auto classes (never remote code)
    if dtype not in _DTYPES:
        raise ModelLoadError(f"Unknown dtype '{dtype}': choose one of {', '.join(_DTYPES)}.")
    dev = pick_device(str(device) if device else None)
    if dev.type == "cpu" and dtype == "float16":
        raise ModelLoadError("float16 needs a GPU; use float32 (or bfloat16) on the CPU.")
    source, local = resolve_source(name)

    hub_kwargs: dict = {}
    if local:
        use_safetensors = _check_local_weights(Path(source), allow_pickle)
    else:
        use_safetensors = not allow_pickle
        try:
            AutoConfig.from_pretrained(source, local_files_only=True, trust_remote_code=False)
            hub_kwargs = {"local_files_only": True}  # cached: never touch the network
        except ValueError:  # cached, but transformers cannot read it (e.g. it names code): checked below
            hub_kwargs = {"local_files_only": True}
        except OSError:
            if not _hub_reachable(probe_timeout):
                raise ModelLoadError(
                    f"'{source}' is not in the local Hugging Face cache and the hub cannot be reached. "
                    f"Fix: download it where there is a network (hf download {source}) and copy the cache, "
                    f"give the path of a local folder written by save_pretrained, or use a bundled model: {', '.join(bundled())}."
                ) from None
    try:
        _refuse_remote_code(name, _config_files(source, local, hub_kwargs))
        config = AutoConfig.from_pretrained(source, trust_remote_code=False, **hub_kwargs)
    except (OSError, ValueError) as exc:
        why = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
        raise ModelLoadError(f"Could not read the configuration of '{name}': {why}") from None
    family = family_for(config)  # raises UnsupportedModelError before any weights load
    files = _weight_files(source, local, hub_kwargs) if use_safetensors else None
    _refuse_oversized(name, config, files, _DTYPES[dtype], max_bytes)  # shapes only: nothing of that size is built

    try:
        with warnings.catch_warnings(), _quiet_transformers():
            warnings.simplefilter("ignore")
            model, info = _auto_class(config).from_pretrained(
                source,
                attn_implementation="eager",
                use_safetensors=use_safetensors,
                dtype=_DTYPES[dtype],
                output_loading_info=True,
                trust_remote_code=False,
                **hub_kwargs,
            )
    except Exception as exc:  # any failure inside a checkpoint (truncated file, bad tensors) is a load error
        hint = "" if allow_pickle else " If the repository only has pickle weights, convert them to safetensors."
        raise ModelLoadError(f"Could not load the weights of '{name}': {str(exc)[:400]}.{hint}") from None
    _refuse_incomplete(name, model, info.get("missing_keys", ()))
    _refuse_non_finite(name, model)
    model.eval().requires_grad_(False).to(dev)

    prep = _processor_settings(source, config, hub_kwargs)
    text = text_tower(model, source, hub_kwargs, info.get("missing_keys", ()))
    text_note = text_tower_note(model, name.strip()) if text is None else ""
    try:
        position = family.position_info(model)
        weights = family.patch_weight(model)
        install(model, family)  # once per loaded model: attention sites and named points, idle outside a call
    except (ValueError, RuntimeError, AttributeError, CaptureError) as exc:
        raise ModelLoadError(f"'{name}' does not have the layout of a {family.name} model: {exc}") from None
    if weights is not None:
        weights.setflags(write=False)
    fixed = family.fixed_size(config)
    has_head = hasattr(model, "classifier") or hasattr(model, "cls_classifier")
    labels = _class_names(config) if has_head else None
    loaded = LoadedModel(
        name=name.strip(),
        source=source,
        model=model,
        family=family,
        device=dev,
        dtype=_DTYPES[dtype],
        patch_size=family.patch_size(config),
        default_size=fixed or family.default_size(config, prep.size),
        image_mean=prep.mean,
        image_std=prep.std,
        rescale_factor=prep.rescale,
        resample=prep.resample,
        channel_order=prep.channel_order,
        center_crop=prep.center_crop,
        id2label=labels,
        position=position,
        patch_weights=weights,
        text=text,
        text_note=text_note,
    )
    return loaded
