"""Which model names a visitor of a public server may load, decided before anything is loaded.

In public mode (:attr:`ServeSettings.public`), :func:`vet_model_request` accepts:

* a name on the allowlist, exactly as listed: the presets the app passes in, the bundled
  demos present in this checkout (:func:`vitviz.demo.bundled`) and the operator's ``allow`` list. It is
  loaded as today, with :func:`vitviz.models.load.load_model`;
* a typed Hugging Face id ``owner/name``, only where the operator set ``allow_hub_ids``,
  and only after the hub's metadata says it fits: ``config.json`` alone is downloaded to
  read ``model_type`` (a supported family), the file list gives the download size (at most
  ``max_download_gb``) and safetensors weights (never pickle). The check pins the commit it
  read, and :func:`load_request` downloads exactly the vetted files of that commit into the
  Hugging Face cache and loads them from there, never from a folder of the server.

Everything else is a path, and every path gets the same message, :data:`PATH_REFUSED`
(or :data:`PATH_REFUSED_HUB` where hub ids are allowed), whether it names a folder, a file,
nothing at all or ``../..``: the decision reads the text only and never the file system.
Whether a name looks like a hub id is also decided from its text alone, so ``tests/data``
gets the hub-id answer whether or not such a folder exists.

Every hub call goes through a :class:`Hub` (injected in tests) with ``token=False``: a token
the server may hold never exposes the operator's private or gated models to visitors.
Outside public mode nothing is checked: the name is returned stripped, as typed.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from vitviz.demo import bundled
from vitviz.errors import VitvizError
from vitviz.serve import hub_checks
from vitviz.serve.settings import ServeSettings

__all__ = [
    "Hub",
    "ModelRequest",
    "PolicyError",
    "allowlist",
    "check_model_request",
    "is_hub_id",
    "load_request",
    "vet_model_request",
    "EMPTY",
    "PATH_REFUSED",
    "PATH_REFUSED_HUB",
    "HUB_ID_REFUSED",
    "HUB_NOT_FOUND",
    "HUB_UNREACHABLE",
    "NO_CONFIG",
    "BAD_CONFIG",
    "UNSUPPORTED",
    "NO_WEIGHTS",
    "UNKNOWN_SIZE",
    "TOO_LARGE",
    "PICKLE_ONLY",
    "DOWNLOAD_FAILED",
]

# The exact messages. Those with {name} echo only text that passed the hub-id pattern.
EMPTY = "No model given: choose one of the models in the list."
PATH_REFUSED = "This public server does not open files or folders typed here. Choose a model from the list."
PATH_REFUSED_HUB = (
    "This public server does not open files or folders typed here. Choose a model from the list, "
    "or type a Hugging Face model id of the form owner/name (e.g. google/vit-base-patch16-224)."
)
HUB_ID_REFUSED = (
    "'{name}' is not one of the models this server offers, and it does not download other models "
    "from the Hugging Face hub. Choose a model from the list."
)
HUB_NOT_FOUND = (
    "'{name}' is not a public model on the Hugging Face hub (it does not exist, or it is private or gated). "
    "Check the spelling, or choose a model from the list."
)
HUB_UNREACHABLE = (
    "The Hugging Face hub cannot be reached from this server right now, so '{name}' cannot be checked. "
    "Choose a model from the list, or try again later."
)
NO_CONFIG = (
    "'{name}' has no config.json on the Hugging Face hub, so it is not a transformers model vitviz can load. "
    "Choose a model from the list."
)
BAD_CONFIG = "The config.json of '{name}' cannot be read ({detail}). Choose a model from the list."
UNSUPPORTED = (
    "'{name}' is a '{model_type}' model, which vitviz does not explain: it supports the model types {types}. "
    "Choose a Vision Transformer checkpoint, or a model from the list."
)
NO_WEIGHTS = (
    "'{name}' has no model weights (model.safetensors) on the Hugging Face hub. "
    "Choose a checkpoint that has them, or a model from the list."
)
UNKNOWN_SIZE = (
    "The Hugging Face hub does not report the size of every file of '{name}', so this server cannot check "
    "it before downloading. Choose a model from the list."
)
TOO_LARGE = (
    "'{name}' needs a {size:.2f} GB download, more than the {limit:g} GB this server allows per model. "
    "Choose a smaller checkpoint, or a model from the list."
)
PICKLE_ONLY = (
    "'{name}' has only pickle weights (pytorch_model.bin), which can run arbitrary code when loaded; this "
    "server loads safetensors only. Choose a checkpoint with model.safetensors, or a model from the list."
)
DOWNLOAD_FAILED = (
    "Downloading '{name}' from the Hugging Face hub failed ({detail}). Try again later, or choose a model "
    "from the list."
)

# owner/name, each part as the hub allows; the text alone decides, never the file system.
_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")
# Top-level files a vetted hub model downloads besides its weights: config, processor, tokenizer.
_AUX_SUFFIXES = (".json", ".txt", ".model")
_MAX_CONFIG_BYTES = 1_000_000
_FLOAT32_BYTES = 4  # load_model's default dtype: the memory estimate from a parameter count


class PolicyError(VitvizError):
    """A model request refused by the public-server policy; ``reason`` is a short code for logs and tests.

    Reasons: ``empty``, ``path``, ``hub_id``, ``not_found``, ``unreachable``, ``no_config``,
    ``bad_config``, ``unsupported``, ``no_weights``, ``unknown_size``, ``too_large``,
    ``pickle``, ``download``, ``config_too_large``, ``bad_index``, ``remote_code``.
    """

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class Hub:
    """The three hub calls the policy makes; tests pass fakes, the server uses :meth:`default`.

    ``model_info(repo_id, *, files_metadata, timeout, token)`` like ``HfApi().model_info``;
    ``download(repo_id, filename, *, revision, token, etag_timeout) -> path`` like
    ``hf_hub_download``; ``snapshot(repo_id, *, revision, allow_patterns, token, etag_timeout) -> folder``
    like ``snapshot_download``.
    """

    model_info: Callable[..., Any]
    download: Callable[..., str]
    snapshot: Callable[..., str]

    @classmethod
    def default(cls) -> Hub:
        from huggingface_hub import HfApi, hf_hub_download, snapshot_download

        return cls(model_info=HfApi().model_info, download=hf_hub_download, snapshot=snapshot_download)


@dataclass(frozen=True)
class ModelRequest:
    """What :func:`vet_model_request` allows, and what the loader needs to know about it."""

    name: str  # the name to load and to key caches by
    hub: bool = False  # a typed hub id vetted here: load it with load_request (pinned files only)
    revision: str | None = None  # the commit whose metadata was checked
    files: tuple[str, ...] = ()  # the files load_request downloads
    download_bytes: int | None = None  # their total size
    memory_bytes: int | None = None  # estimated parameter memory once loaded (float32), for ModelCache


def is_hub_id(text: str) -> bool:
    """Whether ``text`` has the form ``owner/name`` of a Hugging Face id (text only, no file system)."""
    return bool(_HUB_ID.match(text)) and ".." not in text


def allowlist(settings: ServeSettings, presets: Iterable[str] = ()) -> tuple[str, ...]:
    """The names a visitor may pick: the presets, the bundled demos present here, then the operator's ``allow``."""
    return tuple(dict.fromkeys([*(p.strip() for p in presets), *bundled(), *settings.allow]))


def check_model_request(
    name: str, settings: ServeSettings, presets: Iterable[str] = (), *, hub: Hub | None = None
) -> str:
    """The name to load, or :class:`PolicyError` with one of this module's messages.

    Same checks as :func:`vet_model_request`, which also returns what the loader and the
    cache need for a typed hub id (pinned revision, files, estimated memory).
    """
    return vet_model_request(name, settings, presets, hub=hub).name


def vet_model_request(
    name: str, settings: ServeSettings, presets: Iterable[str] = (), *, hub: Hub | None = None
) -> ModelRequest:
    """Decide whether ``name`` may be loaded, before anything is downloaded or read from disk.

    Raises:
        PolicyError: see the module docstring; each refusal has its own exact message.
    """
    text = (name or "").strip()
    if not settings.public:
        return ModelRequest(text)  # local mode: load_model decides, as before
    if not text:
        raise PolicyError(EMPTY, "empty")
    if text in allowlist(settings, presets):
        return ModelRequest(text)
    if not is_hub_id(text):
        raise PolicyError(PATH_REFUSED_HUB if settings.allow_hub_ids else PATH_REFUSED, "path")
    if not settings.allow_hub_ids:
        raise PolicyError(HUB_ID_REFUSED.format(name=text), "hub_id")
    return _vet_hub_id(text, settings, hub or Hub.default())


def _not_found(exc: BaseException) -> bool:
    from huggingface_hub.errors import (
        DisabledRepoError,
        HfHubHTTPError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    if isinstance(exc, (RepositoryNotFoundError, RevisionNotFoundError, DisabledRepoError)):
        return True
    status = getattr(getattr(exc, "response", None), "status_code", None)
    return isinstance(exc, HfHubHTTPError) and status in (401, 403, 404)


def _size(sibling: Any) -> int | None:
    size = getattr(sibling, "size", None)
    if size is None and getattr(sibling, "lfs", None) is not None:
        size = getattr(sibling.lfs, "size", None)
    return None if size is None else int(size)


def _vet_hub_id(repo: str, settings: ServeSettings, hub: Hub) -> ModelRequest:
    try:
        info = hub.model_info(repo, files_metadata=True, timeout=settings.hub_timeout_s, token=False)
    except Exception as exc:
        if _not_found(exc):
            raise PolicyError(HUB_NOT_FOUND.format(name=repo), "not_found") from exc
        raise PolicyError(HUB_UNREACHABLE.format(name=repo), "unreachable") from exc
    if getattr(info, "private", False) or getattr(info, "gated", False) or getattr(info, "disabled", False):
        raise PolicyError(HUB_NOT_FOUND.format(name=repo), "not_found")

    top = {s.rfilename: s for s in (getattr(info, "siblings", None) or []) if "/" not in s.rfilename}
    if "config.json" not in top:
        raise PolicyError(NO_CONFIG.format(name=repo), "no_config")
    safe = [f for f in top if f.endswith(".safetensors")]
    weights = safe or [f for f in top if f.endswith(".bin")]
    if not weights:
        raise PolicyError(NO_WEIGHTS.format(name=repo), "no_weights")
    aux = [f for f in top if f.endswith(_AUX_SUFFIXES)]
    files = sorted({*weights, *aux})
    sizes = [_size(top[f]) for f in files]
    if any(s is None for s in sizes):
        raise PolicyError(UNKNOWN_SIZE.format(name=repo), "unknown_size")
    total = sum(s for s in sizes if s is not None)
    if total > settings.max_download_bytes:
        size = total / 10**9
        raise PolicyError(TOO_LARGE.format(name=repo, size=size, limit=settings.max_download_gb), "too_large")
    if not safe:
        raise PolicyError(PICKLE_ONLY.format(name=repo), "pickle")

    revision = getattr(info, "sha", None)
    model_type, config = _model_type(repo, revision, settings, hub, _size(top["config.json"]))
    if hub_checks.INDEX in top:  # a sharded checkpoint: its index may name only the repository's own files
        _check_index(repo, revision, settings, hub, set(safe), _size(top[hub_checks.INDEX]))
    from vitviz.models.families import supported_model_types

    if model_type not in supported_model_types():
        types = ", ".join(supported_model_types())
        raise PolicyError(UNSUPPORTED.format(name=repo, model_type=model_type, types=types), "unsupported")
    _check_footprint(repo, config, settings)

    weight_bytes = sum(_size(top[f]) or 0 for f in safe)
    params = getattr(getattr(info, "safetensors", None), "total", None)
    memory = max(weight_bytes, int(params) * _FLOAT32_BYTES) if params else weight_bytes
    return ModelRequest(
        repo, hub=True, revision=revision, files=tuple(files), download_bytes=total, memory_bytes=memory
    )


def _model_type(
    repo: str, revision: str | None, settings: ServeSettings, hub: Hub, size: int | None
) -> tuple[str, dict]:
    """``model_type`` and the parsed ``config.json``, the only file downloaded before the checks pass."""
    if size is not None and size > _MAX_CONFIG_BYTES:
        raise PolicyError(BAD_CONFIG.format(name=repo, detail="it is larger than 1 MB"), "bad_config")
    try:
        path = hub.download(repo, "config.json", revision=revision, token=False, etag_timeout=settings.hub_timeout_s)
    except Exception as exc:
        from huggingface_hub.errors import EntryNotFoundError

        if isinstance(exc, EntryNotFoundError):
            raise PolicyError(NO_CONFIG.format(name=repo), "no_config") from exc
        if _not_found(exc):
            raise PolicyError(HUB_NOT_FOUND.format(name=repo), "not_found") from exc
        raise PolicyError(HUB_UNREACHABLE.format(name=repo), "unreachable") from exc
    try:
        if os.path.getsize(path) > _MAX_CONFIG_BYTES:
            raise PolicyError(BAD_CONFIG.format(name=repo, detail="it is larger than 1 MB"), "bad_config")
        with open(path, encoding="utf-8") as fh:
            config = json.load(fh)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        detail = "it is not valid JSON" if isinstance(exc, (ValueError, UnicodeDecodeError)) else "it cannot be read"
        raise PolicyError(BAD_CONFIG.format(name=repo, detail=detail), "bad_config") from exc
    model_type = config.get("model_type") if isinstance(config, dict) else None
    if not isinstance(model_type, str) or not model_type:
        raise PolicyError(BAD_CONFIG.format(name=repo, detail="it names no model_type"), "bad_config")
    if "auto_map" in config:  # code shipped with the checkpoint: never downloaded, never run
        raise PolicyError(hub_checks.REMOTE_CODE.format(name=repo), "remote_code")
    limits = hub_checks.ConfigLimits(
        layers=settings.hub_max_layers, width=settings.hub_max_width, image_size=settings.hub_max_image_size
    )
    problem = hub_checks.config_problem(config, settings.model_memory_bytes, limits)  # before any weight download
    if problem is not None:
        what, value, limit = problem
        message = hub_checks.CONFIG_TOO_LARGE.format(name=repo, what=what, value=value, limit=limit)
        raise PolicyError(message, "config_too_large")
    return model_type, config


def _check_footprint(repo: str, config: dict, settings: ServeSettings) -> None:
    """The model the config describes, counted on the meta device (every family: a Swin's mlp_ratio is in no field
    bound), against the server's model memory, before any weight is downloaded."""
    try:
        need = hub_checks.config_footprint(config)
    except ValueError as exc:
        detail = "it does not describe a model vitviz can build"
        raise PolicyError(BAD_CONFIG.format(name=repo, detail=detail), "bad_config") from exc
    if need.nbytes > settings.model_memory_bytes:
        message = hub_checks.CONFIG_TOO_LARGE.format(
            name=repo,
            what="parameters and buffers (its model, counted before it is built)",
            value=f"about {need.nbytes / 2**30:,.1f} GiB",
            limit=f"at most {settings.model_memory_bytes / 2**30:,.1f} GiB of model memory",
        )
        raise PolicyError(message, "config_too_large")


def _check_index(repo: str, revision: str | None, settings: ServeSettings, hub: Hub, files: set, size) -> None:
    """Refuse a weights index whose entries point outside the repository (or at files it does not have)."""
    if size is not None and size > hub_checks._MAX_INDEX_BYTES:
        raise PolicyError(hub_checks.BAD_INDEX.format(name=repo, detail="larger than 10 MB"), "bad_index")
    try:
        path = hub.download(repo, hub_checks.INDEX, revision=revision, token=False, etag_timeout=settings.hub_timeout_s)
        with open(path, encoding="utf-8") as fh:
            text = fh.read(hub_checks._MAX_INDEX_BYTES + 1)
    except (OSError, UnicodeDecodeError) as exc:
        raise PolicyError(hub_checks.BAD_INDEX.format(name=repo, detail="that cannot be read"), "bad_index") from exc
    except Exception as exc:
        if _not_found(exc):
            raise PolicyError(HUB_NOT_FOUND.format(name=repo), "not_found") from exc
        raise PolicyError(HUB_UNREACHABLE.format(name=repo), "unreachable") from exc
    why = hub_checks.index_problem(text, files)
    if why is not None:
        raise PolicyError(hub_checks.BAD_INDEX.format(name=repo, detail=why), "bad_index")


def load_request(
    request: ModelRequest,
    *,
    load: Callable[[str], Any] | None = None,
    hub: Hub | None = None,
    timeout: float = 10.0,
    on_progress: Callable[[str], None] | None = None,
    max_bytes: int | None = None,
) -> Any:
    """Load what :func:`vet_model_request` allowed; pass it to :meth:`ModelCache.get` as the loader.

    An allowlisted name goes to ``load`` (default :func:`vitviz.models.load.load_model`) as
    today (``max_bytes``: the memory the model may take, checked from its config before it is built). A vetted hub id
    downloads exactly ``request.files`` of ``request.revision`` into
    the Hugging Face cache, then loads that folder; the result keeps the requested name as
    ``name`` and ``source`` (the cache path is the server's business).

    Raises:
        PolicyError: ``download`` when the hub fails, ``not_found`` when the repo went away.
        ModelLoadError, UnsupportedModelError: from ``load``.
    """
    if load is None:
        import functools

        from vitviz.models.load import load_model

        # a config asking for more than max_bytes is refused before its model is built (counted on the meta device)
        load = functools.partial(load_model, max_bytes=max_bytes)
    if not request.hub:
        return load(request.name)
    hub = hub or Hub.default()
    if on_progress is not None:
        size = f" ({request.download_bytes / 10**9:.2f} GB)" if request.download_bytes else ""
        on_progress(f"Downloading {request.name}{size} from the Hugging Face hub…")
    try:
        folder = hub.snapshot(
            request.name,
            revision=request.revision,
            allow_patterns=list(request.files),
            token=False,
            etag_timeout=timeout,
        )
    except Exception as exc:
        if _not_found(exc):
            raise PolicyError(HUB_NOT_FOUND.format(name=request.name), "not_found") from exc
        detail = type(exc).__name__  # not its text: it may name the server's cache folder
        raise PolicyError(DOWNLOAD_FAILED.format(name=request.name, detail=detail), "download") from exc
    if on_progress is not None:
        on_progress(f"Reading {request.name}…")
    try:
        loaded = load(str(folder))
    except VitvizError as exc:  # say the hub id, not the server's cache folder
        try:
            renamed = type(exc)(str(exc).replace(str(folder), request.name))
        except TypeError:
            raise exc from None
        raise renamed from None
    if dataclasses.is_dataclass(loaded) and not isinstance(loaded, type):
        names = {f.name for f in dataclasses.fields(loaded)}
        changes = {k: request.name for k in ("name", "source") if k in names}
        loaded = dataclasses.replace(loaded, **changes)
    return loaded
