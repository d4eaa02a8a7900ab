"""Serving settings: one switch turns public mode on, and the limits that come with it.

Where they come from, later sources winning:

1. the defaults below (they differ between local and public mode, see :class:`ServeSettings`);
2. the ``[public]`` table of a TOML file: ``$VITVIZ_CONFIG`` if set (the file must exist),
   else ``vitviz.toml`` beside the app's ``app.py`` if there is one (never the working
   directory: a server started from elsewhere reads the same file)::

       [public]
       enabled = true
       allow = ["demo", "demo-swin", "google/vit-base-patch16-224"]  # extends the default allowlist
       allow_hub_ids = false          # typed hub ids outside the allowlist, checked before download
       max_download_gb = 1.0          # per typed hub id: weights + config/processor/tokenizer files
       model_memory_gib = 4.0         # all loaded models together (parameters + buffers)
       forward_slots = 1              # forward passes at once; 0 = no limit
       uploads_per_minute = 10        # per session; 0 = no limit
       model_changes_per_minute = 5   # per session; 0 = no limit
       per_address = true             # count uploads and model changes per client address too
       address_table_size = 10000     # client addresses remembered for that, least recently seen forgotten
       hub_downloads_per_hour = 20    # typed hub ids downloaded, whole server; 0 = no limit
       hub_timeout_s = 10.0           # each metadata / config.json call to the hub
       results_max_mb = 512           # a results file (Data set page), decoded; checked from its footer
       results_max_rows = 200000      # rows of a results file
       results_cache_mb = 512         # results files kept in memory, whole server
       image_max_megapixels = 40      # pixels of an image, checked from its header before decoding
       image_max_side = 16384         # longest side of an image in pixels (long thin images)
       decode_budget_mb = 2048        # memory for images being decoded at once, whole server
       hub_max_layers = 64            # a typed hub id's config: blocks (all stages, every tower), before download
       hub_max_width = 4096           # its hidden size (widest stage)
       hub_max_image_size = 2048      # its image_size, each side
       saes = ["/srv/saes/vit-b-l9"]  # SAE folders or files the Features page offers (public: only these)
       sae_indexes = ["/srv/saes/vit-b-l9/index.parquet"]  # feature indexes it offers (public: only these)

3. environment variables: ``VITVIZ_PUBLIC``, ``VITVIZ_ALLOW`` (comma-separated; replaces the
   file's ``allow``, both extend the default allowlist), ``VITVIZ_ALLOW_HUB_IDS``,
   ``VITVIZ_MAX_DOWNLOAD_GB``, ``VITVIZ_MODEL_MEMORY_GIB``, ``VITVIZ_FORWARD_SLOTS``,
   ``VITVIZ_UPLOADS_PER_MINUTE``, ``VITVIZ_MODEL_CHANGES_PER_MINUTE``, ``VITVIZ_PER_ADDRESS``,
   ``VITVIZ_ADDRESS_TABLE_SIZE``,
   ``VITVIZ_HUB_DOWNLOADS_PER_HOUR``, ``VITVIZ_HUB_TIMEOUT_S``, ``VITVIZ_RESULTS_MAX_MB``,
   ``VITVIZ_RESULTS_MAX_ROWS``, ``VITVIZ_RESULTS_CACHE_MB``, ``VITVIZ_IMAGE_MAX_MEGAPIXELS``,
   ``VITVIZ_IMAGE_MAX_SIDE``, ``VITVIZ_DECODE_BUDGET_MB``, ``VITVIZ_HUB_MAX_LAYERS``,
   ``VITVIZ_HUB_MAX_WIDTH``, ``VITVIZ_HUB_MAX_IMAGE_SIZE``, ``VITVIZ_SAES``, ``VITVIZ_SAE_INDEXES``
   (comma-separated; each replaces the file's list).

Only the Streamlit app reads these; the command line is never affected. A value that does
not parse raises :class:`SettingsError` naming where it came from, so a typo in an operator's
file fails closed instead of silently leaving the server open: ``vitviz app`` reads the
settings before starting Streamlit and exits with code 2; under ``streamlit run app.py`` (no
vitviz code runs before the first session) every page shows the error and serves nothing. The
message names the file by its name only (``vitviz.toml``); the full path is in
``SettingsError.detail`` for the server log, so a visitor never sees the server's folders.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from vitviz.demo import BUNDLED
from vitviz.errors import VitvizError

__all__ = [
    "app_script",
    "DEMOS",
    "CONFIG_FILE",
    "DEFAULT_MAX_DOWNLOAD_GB",
    "DEFAULT_MODEL_MEMORY_GIB",
    "ServeSettings",
    "SettingsError",
    "load_settings",
    "log_settings",
    "server_log",
]

DEMOS = tuple(BUNDLED)  # bundled with vitviz (demo, demo-swin, demo-clip): always allowed
CONFIG_FILE = "vitviz.toml"

DEFAULT_MAX_DOWNLOAD_GB = 1.0  # decimal GB (10**9 bytes), as the hub reports sizes
DEFAULT_MODEL_MEMORY_GIB = 4.0  # both modes: about ten ViT-Base models, or three ViT-Large
DEFAULT_HUB_TIMEOUT_S = 10.0
# Input limits, the same in both modes (what one file may cost the server).
DEFAULT_RESULTS_MAX_MB = 512.0  # a results file decoded (vitviz.evaluate.results.ResultsLimits)
DEFAULT_RESULTS_MAX_ROWS = 200_000
DEFAULT_RESULTS_CACHE_MB = 512.0
DEFAULT_IMAGE_MAX_MEGAPIXELS = 40.0  # vitviz.data.images.MAX_PIXELS
DEFAULT_IMAGE_MAX_SIDE = 16_384  # vitviz.data.images.MAX_SIDE
DEFAULT_DECODE_BUDGET_MB = 2048.0  # vitviz.data.images.DecodeBudget, whole server
# Mode-dependent defaults (public, local). 0 means "no limit".
PUBLIC_FORWARD_SLOTS_CPU = 1  # forward passes share the cores: two at once only make both slower
PUBLIC_FORWARD_SLOTS_GPU = 2  # one pass leaves a GPU idle while Python prepares the next
PUBLIC_UPLOADS_PER_MINUTE = 10
PUBLIC_MODEL_CHANGES_PER_MINUTE = 5
PUBLIC_HUB_DOWNLOADS_PER_HOUR = 20
PUBLIC_MAX_TOKENS = 2048  # tokens of one image's input (DINOv2 at 518 px: 1,370; ViT-B/16 at 704 px: 1,937)
# Forward-equivalents x tokens one patching request may cost (a ViT-B/16 at 224 px, T = 197: every exact grid, ~1,160
# forward-equivalents; at T = 2,161 the bound stops after ~115 of them).
PUBLIC_PATCHING_MAX_WORK = 250_000.0
DEFAULT_ADDRESS_TABLE_SIZE = 10_000  # client addresses whose uploads and model changes are counted (LRU)

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


class SettingsError(VitvizError):
    """A serving setting (environment variable or ``vitviz.toml``) does not parse.

    ``str(exc)`` names the file by its name only (safe to show a visitor); ``detail`` adds
    its full path, for the server log.
    """

    def __init__(self, message: str, detail: str | None = None) -> None:
        super().__init__(message)
        self.detail = detail or message


def _cuda_available() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:  # no torch, or a broken driver: plan for the CPU
        return False


@dataclass(frozen=True)
class ServeSettings:
    """How the app serves visitors. Build it with :func:`load_settings`; construct it directly in tests.

    Fields left ``None`` take the default of the mode (``public``) in ``__post_init__``, so
    after construction every field holds a concrete value:

    ==========================  ===============================  ==================
    field                       public mode                      local mode
    ==========================  ===============================  ==================
    ``allow``                   extra allowed names (``()``)     not used
    ``allow_hub_ids``           ``False``                        not used
    ``max_download_gb``         1.0 GB per typed hub id          not used
    ``model_memory_gib``        4.0 GiB, larger models refused   4.0 GiB, a larger
                                                                 model is kept alone
    ``forward_slots``           1 on CPU, 2 with a CUDA GPU      0 (no queue)
    ``uploads_per_minute``      10 per session                   0 (no limit)
    ``model_changes_per_minute``  5 per session                  0 (no limit)
    ``per_address``             ``True``: both also per address   ``False``
    ``address_table_size``      10,000 addresses remembered      not used
    ``hub_downloads_per_hour``  20 for the whole server          0 (no limit)
    ``hub_timeout_s``           10 s                             not used
    ``results_max_mb``          512 MB per results file (decoded), both modes
    ``results_max_rows``        200,000 rows per results file, both modes
    ``results_cache_mb``        512 MB of results files kept, whole server, both modes
    ``image_max_megapixels``    40 megapixels per image, both modes
    ``image_max_side``          16,384 px longest side, both modes
    ``decode_budget_mb``        2,048 MB of images decoding at once, whole server
    ``hub_max_layers``          64 blocks in a hub config        public mode (hub ids)
    ``hub_max_width``           4,096 hidden size                public mode (hub ids)
    ``hub_max_image_size``      2,048 px image_size              public mode (hub ids)
    ``saes``                    the only SAEs offered (besides   offered besides a
                                the demo SAE), ``()``            typed path
    ``sae_indexes``             the only feature indexes         offered besides a
                                offered, ``()``                  typed path
    ``max_tokens``              2,048 tokens per image           0 (no limit)
    ``patching_max_work``       250,000 (forward-equivalents     0 (no limit)
                                x tokens) per patching request
    ==========================  ===============================  ==================

    A value set explicitly (file or environment) applies in both modes, except the model
    policy (allowlist, hub ids), which only public mode enforces.
    """

    public: bool = False
    allow: tuple[str, ...] = ()
    allow_hub_ids: bool = False
    max_download_gb: float = DEFAULT_MAX_DOWNLOAD_GB
    model_memory_gib: float = DEFAULT_MODEL_MEMORY_GIB
    forward_slots: int | None = None
    uploads_per_minute: int | None = None
    model_changes_per_minute: int | None = None
    hub_downloads_per_hour: int | None = None
    per_address: bool | None = None
    address_table_size: int = DEFAULT_ADDRESS_TABLE_SIZE
    hub_timeout_s: float = DEFAULT_HUB_TIMEOUT_S
    results_max_mb: float = DEFAULT_RESULTS_MAX_MB
    results_max_rows: int = DEFAULT_RESULTS_MAX_ROWS
    results_cache_mb: float = DEFAULT_RESULTS_CACHE_MB
    image_max_megapixels: float = DEFAULT_IMAGE_MAX_MEGAPIXELS
    image_max_side: int = DEFAULT_IMAGE_MAX_SIDE
    decode_budget_mb: float = DEFAULT_DECODE_BUDGET_MB
    hub_max_layers: int = 64
    hub_max_width: int = 4096
    hub_max_image_size: int = 2048
    max_tokens: int | None = None
    patching_max_work: float | None = None
    saes: tuple[str, ...] = ()  # SAE folders or files the Features page offers (public mode: the only ones)
    sae_indexes: tuple[str, ...] = ()  # feature index files it offers (public mode: the only ones)
    origin: str = field(default="defaults", compare=False)  # where the values came from, for logs

    def __post_init__(self) -> None:
        def fill(name: str, public: int, local: int) -> None:
            if getattr(self, name) is None:
                object.__setattr__(self, name, public if self.public else local)

        if self.forward_slots is None:
            gpu = self.public and _cuda_available()
            fill("forward_slots", PUBLIC_FORWARD_SLOTS_GPU if gpu else PUBLIC_FORWARD_SLOTS_CPU, 0)
        fill("uploads_per_minute", PUBLIC_UPLOADS_PER_MINUTE, 0)
        fill("model_changes_per_minute", PUBLIC_MODEL_CHANGES_PER_MINUTE, 0)
        fill("hub_downloads_per_hour", PUBLIC_HUB_DOWNLOADS_PER_HOUR, 0)
        fill("max_tokens", PUBLIC_MAX_TOKENS, 0)
        fill("patching_max_work", PUBLIC_PATCHING_MAX_WORK, 0)
        if self.per_address is None:  # public mode counts per client address too (a reload is a new session)
            object.__setattr__(self, "per_address", self.public)
        for name in ("allow", "saes", "sae_indexes"):
            value = getattr(self, name)
            object.__setattr__(self, name, tuple(dict.fromkeys(a.strip() for a in value if a.strip())))
        positive = ("max_download_gb", "model_memory_gib", "hub_timeout_s", "results_max_mb", "results_max_rows")
        positive += ("results_cache_mb", "image_max_megapixels", "image_max_side", "decode_budget_mb")
        positive += ("hub_max_layers", "hub_max_width", "hub_max_image_size", "address_table_size")
        for name in positive:
            if not getattr(self, name) > 0:
                raise SettingsError(f"{name} must be a positive number, not {getattr(self, name)!r}.")
        limits = ("forward_slots", "uploads_per_minute", "model_changes_per_minute", "hub_downloads_per_hour")
        for name in (*limits, "max_tokens", "patching_max_work"):
            if getattr(self, name) < 0:
                raise SettingsError(f"{name} must be 0 (no limit) or more, not {getattr(self, name)!r}.")

    @property
    def model_memory_bytes(self) -> int:
        return int(self.model_memory_gib * 2**30)

    @property
    def max_download_bytes(self) -> int:
        return int(self.max_download_gb * 10**9)

    @property
    def results_limits(self):
        """What the Data set page agrees to decode (:class:`vitviz.evaluate.results.ResultsLimits`)."""
        from vitviz.evaluate.results import ResultsLimits

        return ResultsLimits(max_rows=self.results_max_rows, max_bytes=int(self.results_max_mb * 2**20))

    def describe(self) -> str:
        """One line for the server log, e.g. at start."""
        if not self.public:
            return f"vitviz local mode (model memory {self.model_memory_gib:g} GiB; settings from {self.origin})"
        hub = f"typed hub ids up to {self.max_download_gb:g} GB" if self.allow_hub_ids else "no typed hub ids"
        slots = self.forward_slots or "unlimited"
        return (
            f"vitviz public mode: {len(self.allow)} extra allowed models, {hub}, model memory "
            f"{self.model_memory_gib:g} GiB, {slots} forward slots, {self.uploads_per_minute} uploads and "
            f"{self.model_changes_per_minute} model changes per minute per session"
            f"{' and per client address' if self.per_address else ''} (settings from {self.origin})"
        )


_FILE_KEYS = {
    "enabled": "public",
    "allow": "allow",
    "allow_hub_ids": "allow_hub_ids",
    "max_download_gb": "max_download_gb",
    "model_memory_gib": "model_memory_gib",
    "forward_slots": "forward_slots",
    "uploads_per_minute": "uploads_per_minute",
    "model_changes_per_minute": "model_changes_per_minute",
    "hub_downloads_per_hour": "hub_downloads_per_hour",
    "hub_timeout_s": "hub_timeout_s",
    "results_max_mb": "results_max_mb",
    "results_max_rows": "results_max_rows",
    "results_cache_mb": "results_cache_mb",
    "image_max_megapixels": "image_max_megapixels",
    "image_max_side": "image_max_side",
    "decode_budget_mb": "decode_budget_mb",
    "hub_max_layers": "hub_max_layers",
    "hub_max_width": "hub_max_width",
    "hub_max_image_size": "hub_max_image_size",
    "max_tokens": "max_tokens",
    "patching_max_work": "patching_max_work",
    "per_address": "per_address",
    "address_table_size": "address_table_size",
    "saes": "saes",
    "sae_indexes": "sae_indexes",
}
_ENV_KEYS = {
    "VITVIZ_PUBLIC": "public",
    "VITVIZ_ALLOW": "allow",
    "VITVIZ_ALLOW_HUB_IDS": "allow_hub_ids",
    "VITVIZ_MAX_DOWNLOAD_GB": "max_download_gb",
    "VITVIZ_MODEL_MEMORY_GIB": "model_memory_gib",
    "VITVIZ_FORWARD_SLOTS": "forward_slots",
    "VITVIZ_UPLOADS_PER_MINUTE": "uploads_per_minute",
    "VITVIZ_MODEL_CHANGES_PER_MINUTE": "model_changes_per_minute",
    "VITVIZ_HUB_DOWNLOADS_PER_HOUR": "hub_downloads_per_hour",
    "VITVIZ_HUB_TIMEOUT_S": "hub_timeout_s",
    "VITVIZ_RESULTS_MAX_MB": "results_max_mb",
    "VITVIZ_RESULTS_MAX_ROWS": "results_max_rows",
    "VITVIZ_RESULTS_CACHE_MB": "results_cache_mb",
    "VITVIZ_IMAGE_MAX_MEGAPIXELS": "image_max_megapixels",
    "VITVIZ_IMAGE_MAX_SIDE": "image_max_side",
    "VITVIZ_DECODE_BUDGET_MB": "decode_budget_mb",
    "VITVIZ_HUB_MAX_LAYERS": "hub_max_layers",
    "VITVIZ_HUB_MAX_WIDTH": "hub_max_width",
    "VITVIZ_HUB_MAX_IMAGE_SIZE": "hub_max_image_size",
    "VITVIZ_MAX_TOKENS": "max_tokens",
    "VITVIZ_PATCHING_MAX_WORK": "patching_max_work",
    "VITVIZ_PER_ADDRESS": "per_address",
    "VITVIZ_ADDRESS_TABLE_SIZE": "address_table_size",
    "VITVIZ_SAES": "saes",
    "VITVIZ_SAE_INDEXES": "sae_indexes",
}
_KINDS = {f.name: f.type for f in fields(ServeSettings)}


def _kind(name: str) -> str:
    text = str(_KINDS[name])
    return "bool" if "bool" in text else "int" if "int" in text else "float" if "float" in text else "names"


def _from_text(name: str, text: str, where: str) -> Any:
    """Parse an environment variable's text for field ``name``."""
    kind, raw = _kind(name), text.strip()
    if kind == "names":
        return tuple(part.strip() for part in raw.split(",") if part.strip())
    if kind == "bool":
        if raw.lower() in _TRUE:
            return True
        if raw.lower() in _FALSE:
            return False
        raise SettingsError(f"{where} must be 1/true/yes/on or 0/false/no/off, not {text!r}.")
    try:
        return int(raw) if kind == "int" else float(raw)
    except ValueError:
        what = "a whole number" if kind == "int" else "a number"
        raise SettingsError(f"{where} must be {what}, not {text!r}.") from None


def _from_toml(name: str, value: Any, where: str) -> Any:
    """Check a TOML value's type for field ``name``."""
    kind = _kind(name)
    if kind == "names":
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            if name != "allow":
                raise SettingsError(f'{where} must be a list of paths on the server, like ["/srv/saes/sae-1"].')
            raise SettingsError(f'{where} must be a list of model names, like ["demo", "google/vit-base-patch16-224"].')
        return tuple(value)
    if kind == "bool":
        if not isinstance(value, bool):
            raise SettingsError(f"{where} must be true or false, not {value!r}.")
        return value
    if kind == "int" and (isinstance(value, bool) or not isinstance(value, int)):
        raise SettingsError(f"{where} must be a whole number, not {value!r}.")
    if kind == "float" and (isinstance(value, bool) or not isinstance(value, (int, float))):
        raise SettingsError(f"{where} must be a number, not {value!r}.")
    return float(value) if kind == "float" else value


def _read_toml(path: Path) -> dict[str, Any]:
    """The ``[public]`` table of ``path``; errors name the file by its name, the full path goes to ``detail``."""
    try:
        return _parse_toml(path, path.name)
    except SettingsError as exc:
        raise SettingsError(str(exc), detail=f"{exc} (settings file: {path})") from None


def _parse_toml(path: Path, shown: str) -> dict[str, Any]:
    try:
        import tomllib
    except ImportError:  # Python 3.10
        try:
            import tomli as tomllib  # type: ignore[no-redef]
        except ImportError:
            raise SettingsError(
                f"Reading {shown} needs Python 3.11+ (tomllib) or the tomli package: pip install tomli."
            ) from None
    try:
        with path.open("rb") as fh:
            data = tomllib.load(fh)
    except OSError as exc:
        raise SettingsError(f"Cannot read the settings file {shown}: {exc.strerror or exc}.") from None
    except tomllib.TOMLDecodeError as exc:
        raise SettingsError(f"{shown} is not valid TOML ({exc}). Fix the file, or remove it.") from None
    table = data.get("public", {})
    if not isinstance(table, dict):
        raise SettingsError(f"In {shown}, 'public' must be a table: a line [public] followed by key = value lines.")
    unknown = sorted(set(table) - set(_FILE_KEYS))
    if unknown:
        raise SettingsError(
            f"{shown} has unknown setting(s) {', '.join(unknown)} in [public]; "
            f"the known ones are {', '.join(_FILE_KEYS)}."
        )
    return {_FILE_KEYS[k]: _from_toml(_FILE_KEYS[k], v, f"'{k}' in {shown}") for k, v in table.items()}


def app_script() -> Path:
    """``app.py`` of the installed package ``vitviz_app``, else of the source checkout beside ``vitviz/``."""
    spec = importlib.util.find_spec("vitviz_app")
    if spec is not None and spec.submodule_search_locations:
        for root in spec.submodule_search_locations:
            if (Path(root) / "app.py").is_file():
                return Path(root) / "app.py"
    source = Path(__file__).resolve().parents[2] / "app.py"
    if source.is_file():
        return source
    raise VitvizError("the vitviz app (app.py and pages/) is not installed: reinstall vitviz with pip")


def app_folder() -> Path | None:
    """The folder of the app's ``app.py`` (installed package or source checkout), or None without the app."""
    try:
        return app_script().parent
    except VitvizError:
        return None


def config_path(environ: Mapping[str, str] | None = None, folder: str | Path | None = None) -> Path | None:
    """The settings file to read: ``$VITVIZ_CONFIG`` (which must exist), else ``vitviz.toml`` beside ``app.py``.

    ``folder``: where ``app.py`` is (default: :func:`app_folder`). The working directory is never
    looked at, so the file read does not depend on where the server was started.
    """
    env = os.environ if environ is None else environ
    explicit = env.get("VITVIZ_CONFIG", "").strip()
    if explicit:
        path = Path(explicit).expanduser()
        if not path.is_file():
            raise SettingsError(
                "VITVIZ_CONFIG does not point to a file. Fix the path, or unset it.",
                detail=f"VITVIZ_CONFIG points to {path}, which is not a file. Fix the path, or unset it.",
            )
        return path
    folder = app_folder() if folder is None else Path(folder)
    if folder is None:
        return None
    beside = Path(folder) / CONFIG_FILE
    return beside if beside.is_file() else None


def load_settings(environ: Mapping[str, str] | None = None, folder: str | Path | None = None) -> ServeSettings:
    """Defaults, then the settings file, then environment variables (see the module docstring).

    ``folder``: where ``app.py`` is, to find ``vitviz.toml`` beside it (default: :func:`app_folder`).

    Raises:
        SettingsError: a file that does not parse, an unknown key, or a value of the wrong type.
    """
    env = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    origins = []
    path = config_path(env, folder)
    if path is not None:
        values.update(_read_toml(path))
        origins.append(str(path))
    used = []
    for var, name in _ENV_KEYS.items():
        text = env.get(var)
        if text is not None and text.strip():
            values[name] = _from_text(name, text, var)
            used.append(var)
    if used:
        origins.append("environment " + ", ".join(used))
    return ServeSettings(**values, origin="; ".join(origins) or "defaults")


class _Stderr(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is at the time (Streamlit and test runners replace it)."""

    def emit(self, record: logging.LogRecord) -> None:
        self.stream = sys.stderr
        super().emit(record)


def server_log() -> logging.Logger:
    """The ``vitviz.serve`` logger; it writes to the server's stderr even where nothing configured logging."""
    log = logging.getLogger("vitviz.serve")
    if not log.handlers:
        handler = _Stderr()
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
        log.propagate = False
    return log


def log_settings(settings: ServeSettings) -> str:
    """Log which settings file was read and whether public mode is on (``vitviz app``: before Streamlit starts;
    the app: at the first session); returns the line."""
    line = settings.describe()
    server_log().info(line)
    return line
