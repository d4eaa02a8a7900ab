"""Streamlit wiring shared by the pages: cached model and capture, session state, small widgets (the target and
labels boxes are :mod:`ui.target_boxes`).

All computing happens in ``vitviz``; this module only caches its results and
reads widgets. Caching rules:

* models: ``st.cache_resource`` (one copy shared by every session; read-only after loading);
* captures: one server-wide :class:`vitviz.cache.BoundedCache` (bounded in entries and
  bytes), keyed by (model, image digest, input size). A ``Capture`` is a frozen
  record of read-only arrays, so sharing it is safe and avoids copying ~10 MB
  through pickle on every rerun, as ``st.cache_data`` would;
* what the views compute from a capture or a Run (rollout, relevance, knock-outs, curves, ...): in
  :mod:`ui.cached`, keyed like the capture or by model.
"""

from __future__ import annotations

import hashlib
import io
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TypeVar

import numpy as np
import streamlit as st

from ui import click_chart
from ui.navigation import leave_folder_mode
from ui.startup import preload
from vitviz.cache import BoundedCache
from vitviz.capture import forward as vcapture
from vitviz.capture.forward import predictions_from_logits
from vitviz.capture.targets import Target
from vitviz.data.images import configure as configure_images
from vitviz.data.images import mirrored_png, read_image
from vitviz.errors import VitvizError
from vitviz.models.load import LoadedModel, parse_model_name
from vitviz.models.zeroshot import (
    Labels,
    ZeroShotError,
    from_logits,
    legend,
    parse_labels,
    rank,
    score,
    text_embeddings,
)
from vitviz.presets import PRESETS
from vitviz.record import POOLED, Prediction
from vitviz.serve import (
    AddressLimits,
    ForwardQueue,
    ModelCache,
    ModelRequest,
    RateLimit,
    ServeSettings,
    SessionLimits,
    SettingsError,
    allowlist,
    hub_download_limit,
    load_request,
    load_settings,
    vet_model_request,
)
from vitviz.serve.settings import log_settings, server_log
from vitviz.tables import csv_bytes, long_table

preload()  # before sessions draw figures in parallel threads (pandas half-imported by one broke another's Plotly)
T = TypeVar("T")
ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "assets" / "examples"
DEFAULTS = {
    "model_name": "demo",
    "image_name": "demo-star.png",
    "image_bytes": None,
    "input_size": None,
    "keep_aspect": False,  # the sidebar's box: the user's choice, kept when a fallback makes the input square
    "layer": None,
    "head": 0,
    "query": None,  # a token of stage ``query_stage``, POOLED, or None (the model's default: CLS, else pooled)
    "query_stage": 0,
    "show_windows": True,
    "direction": "where does it look?",
    "class_index": None,  # None: the image's top-1
    "class_minus": None,  # the class (or label) subtracted from class_index's score in relevance; None: none
    "class_pinned": False,  # True: a new image keeps the class (else it explains its own top-1)
    "knockout": [],  # heads knocked out on the Heads page: [block, head] pairs
    "knockout_mode": "mean",
    "labels_text": None,  # zero-shot models: what the user typed (None: the model's suggestion)
    "template": None,  # zero-shot models: the prompt template (None: the model's own)
    "fusion": "mean",
    "rollout_range": None,
    "discard": 0.0,
    "relevance_from": 0,  # relevance through blocks k..L-1 (0: all blocks, MM-Explainability's start_layer=0)
    "tau": 0.6,
    "metric": "distance",
    "position": 0,
}
DIRECTIONS = ("where does it look?", "who looks at it?")
# What belongs to a model and goes back to its default when the model changes: positions in its
# blocks, heads and grids, its classes and labels, its knock-outs, computations asked of it.
MODEL_STATE = (
    "input_size",
    "layer",
    "head",
    "query",
    "query_stage",
    "class_index",
    "class_minus",
    "class_pinned",
    "knockout",
    "labels_text",
    "template",
    "rollout_range",
    "position",
)
MODEL_REQUESTS = ("curves_wanted", "importance_wanted")  # "Compute ..." clicks; their Stop goes with the model


@st.cache_resource(show_spinner=False)
def serve_settings() -> ServeSettings:
    """Public mode and its limits (``VITVIZ_PUBLIC`` / ``vitviz.toml`` beside app.py), read once per server.

    The server log says which file was read and whether public mode is on; a file that does not
    parse is logged with its full path, while visitors see its name only.
    """
    try:
        settings = load_settings(folder=ROOT)
    except SettingsError as exc:
        server_log().error("vitviz settings not loaded: %s", exc.detail)
        raise
    configure_images(  # process-wide: every session's decoding shares one budget
        max_pixels=int(settings.image_max_megapixels * 1e6),
        max_side=settings.image_max_side,
        budget_bytes=int(settings.decode_budget_mb * 2**20),
    )
    log_settings(settings)
    return settings


def last_resort(exc: BaseException, where: str) -> str:
    """What a visitor reads of an unexpected error; the server log gets it in full, with its traceback.

    vitviz's own messages are written for visitors; other exceptions may name the server's
    files, so in public mode only their type is shown.
    """
    server_log().error("unexpected error in %s (session %s)", where, session_id(), exc_info=exc)
    try:
        public = serve_settings().public
    except SettingsError:
        public = True
    if isinstance(exc, VitvizError) or not public:
        return f"{type(exc).__name__}: {exc}"
    return f"{type(exc).__name__}; the details are in the server's log"


@st.cache_resource(show_spinner=False)
def model_cache() -> ModelCache:
    """Loaded models, bounded by the memory their parameters take; the least recently used go first."""
    from vitviz.capture.run import clear_runs

    # an evicted model's cached runs hold it (and their graphs): drop them so its memory really goes
    return ModelCache.from_settings(serve_settings(), on_evict=lambda loaded: clear_runs(loaded.model))


@st.cache_resource(show_spinner=False)
def forward_queue() -> ForwardQueue:
    """At most K forward passes at once in the server (no limit outside public mode)."""
    return ForwardQueue.from_settings(serve_settings())


@st.cache_resource(show_spinner=False)
def vetted_requests() -> dict[str, ModelRequest]:
    """Names a visitor was allowed to load, server-wide: a model dropped for memory reloads without asking the hub."""
    return {}


@st.cache_resource(show_spinner=False)
def hub_downloads() -> RateLimit:
    return hub_download_limit(serve_settings())


def get_model(name: str, progress: Callable[[str], None] | None = None) -> LoadedModel:
    """The shared model ``name``, (re)loaded through the memory-bounded cache with ``progress`` messages."""
    req = vetted_requests().get(name) or ModelRequest(name)
    settings = serve_settings()
    limit = settings.model_memory_bytes if settings.public else None  # public: too large is refused before building

    def load() -> LoadedModel:
        return load_request(req, on_progress=progress, max_bytes=limit)

    return model_cache().get(name, load, on_progress=progress, expected_bytes=req.memory_bytes)


def session_limits() -> SessionLimits:
    """The limits this visitor's uploads and model changes count against: the session's (kept in its state, as
    ``_limits``) and, in public mode with ``per_address``, those of the client's address, which a new session
    (a page reload) does not reset."""
    ss = st.session_state
    if "_limits" not in ss:
        ss._limits = SessionLimits.from_settings(serve_settings())
    settings = serve_settings()
    address = client_address() if settings.public and settings.per_address else None
    return ss._limits if address is None else ss._limits.with_address(address_limits().get(address))


@st.cache_resource(show_spinner=False)
def address_limits() -> AddressLimits:
    """Each client address's limits, server-wide, in a bounded table (the least recently seen forgotten first)."""
    return AddressLimits(serve_settings())


def client_address() -> str | None:
    """The visitor's address as the server sees the connection (``st.context.ip_address``): a proxy's address
    behind a proxy; None for a visitor on this machine (Streamlit gives none for localhost) and in tests."""
    try:
        return st.context.ip_address or None
    except Exception:  # no session context (a bare script run)
        return None


@st.cache_resource(ttl=300, show_spinner=False)
def hub_online() -> bool:
    """Whether the server reaches the Hugging Face hub (checked at most every 5 minutes)."""
    from vitviz.serve.offline import hub_online as reachable

    return reachable()


def request_model(text: str, *, refusal_key: str = "model_refusal") -> str | None:
    """What a visitor typed or picked -> the name to load, after the public-mode policy; shows why not.

    Call it once per choice a user makes, in any pane (each call counts as a model change in public
    mode); the refusal is also kept in ``refusal_key`` (message, whether asking again later may work).
    """
    from vitviz.serve.limits import RateLimitError
    from vitviz.serve.offline import HUB_OFFLINE, loads_offline

    settings = serve_settings()
    st.session_state[refusal_key] = None
    try:
        if settings.public:
            session_limits().model_changes.acquire()
        req = vet_model_request(text, settings, PRESETS)  # public mode: before anything touches the disk
        if not settings.public:
            parse_model_name(req.name)
        elif req.name not in model_cache().sizes() and not loads_offline(req.name) and not hub_online():
            raise VitvizError(HUB_OFFLINE.format(name=req.name))
        elif req.hub and req.name not in model_cache().sizes():
            hub_downloads().acquire()
    except VitvizError as exc:
        st.error(str(exc))
        st.session_state[refusal_key] = (str(exc), isinstance(exc, RateLimitError))
        return None
    vetted_requests()[req.name] = req
    return req.name


def session_id() -> str:
    from streamlit.runtime.scriptrunner import get_script_run_ctx

    ctx = get_script_run_ctx()
    return ctx.session_id if ctx is not None else "local"


def in_queue(compute: Callable[[], T]) -> T:
    """Run a forward pass in the server's queue; while waiting, the visitor sees their place and the time.

    Only what needs a forward pass comes here: view changes reuse cached results and never wait.
    """
    note = st.empty()

    def on_wait(place: int, elapsed: float) -> None:
        ahead = "you are next" if place <= 1 else f"{place - 1} visitors are ahead of you"
        note.info(f"The server runs one analysis at a time: {ahead} ({elapsed:.0f} s so far).")

    try:
        with forward_queue().slot(session_id(), on_wait=on_wait):
            note.empty()
            return compute()
    finally:
        note.empty()


CAPTURE_CACHE_MB = int(os.environ.get("VITVIZ_CAPTURE_CACHE_MB", "1024"))


@st.cache_resource(show_spinner=False)
def capture_cache() -> BoundedCache:
    """One cache for the whole server, bounded in entries and in bytes."""
    return BoundedCache(max_entries=32, max_bytes=CAPTURE_CACHE_MB * 2**20, size_of=lambda cap: cap.nbytes)


def get_capture(
    model_name: str, image_digest: str, size: tuple[int, int] | None, image_bytes: bytes
) -> vcapture.Capture:
    """The capture of the session's image: one forward pass per (model, image, size), in the server's queue.

    It is the capture of the image's Run (``vitviz.capture.run``), so the causal views and relevance of the
    same image read that forward instead of making their own."""
    from vitviz.capture.run import get_run

    def compute() -> vcapture.Capture:
        image = read_image(image_bytes, max_bytes=upload_limit()).image
        model = get_model(model_name)
        check_tokens(model, size, image.size)  # public mode: before any forward
        return in_queue(lambda: get_run(model, image, size=size).capture)

    return capture_cache().get_or_compute((model_name, image_digest, size), compute)


def batch_slot():
    """One batch of a long analysis (a patching grid) in the server's queue: the slot is held for that batch
    alone and its place is not kept, so other visitors' forwards run between the batches."""
    return forward_queue().slot(None)


def patching_work_bound() -> float | None:
    """The most work one patching request may cost (forward-equivalents x tokens; None: no bound)."""
    return serve_settings().patching_max_work or None


def check_tokens(model: LoadedModel, size: tuple[int, int] | None, image_wh: tuple[int, int]) -> None:
    """Refuse, before any forward, an input larger than the server's token bound (public mode's ``max_tokens``)."""
    from vitviz.errors import BudgetError

    bound = serve_settings().max_tokens
    if not bound:
        return
    hw = vcapture.input_size_for(model, size, image_wh)
    kinds, (gh, gw) = vcapture.token_layout(model, hw)
    tokens = len(kinds) + gh * gw
    if tokens > bound:
        raise BudgetError(
            f"This server analyses at most {bound:,} tokens per image (its max_tokens setting); an input of {hw[1]} x {hw[0]} px is "
            f"{tokens:,} tokens ({gh} x {gw} patches). Choose a smaller input size, or untick 'Keep the image's "
            "aspect ratio'."
        )


@st.cache_resource(show_spinner=False)
def flipped_cache() -> BoundedCache:
    """Mirrored copies of images (PNG bytes and digest) by the image's digest, server-wide, bounded in bytes."""
    return BoundedCache(max_entries=16, max_bytes=256 * 2**20, size_of=lambda pair: len(pair[0]))


def flipped_image(data: bytes, image_digest: str) -> tuple[bytes, str]:
    """``data`` mirrored left to right as PNG, and that PNG's digest: made once per image digest for the whole
    server (concurrent sessions wait for one), decoded, mirrored and encoded inside the decode budget."""

    def compute() -> tuple[bytes, str]:
        png = mirrored_png(data, max_bytes=upload_limit())
        return png, digest(png)

    return flipped_cache().get_or_compute(image_digest, compute)


def upload_limit() -> int:
    """The upload size limit of ``.streamlit/config.toml`` in bytes, applied to every image read."""
    return int(st.get_option("server.maxUploadSize")) * 2**20


def nbytes_of(value) -> int:
    """A cached result's size: arrays, captures (``nbytes``), records holding arrays (their fields)."""
    if isinstance(value, tuple):
        return sum(nbytes_of(v) for v in value)
    size = getattr(value, "nbytes", None)
    if size is not None:
        return int(size)
    fields = getattr(value, "__dataclass_fields__", {})
    return sum(int(getattr(getattr(value, f), "nbytes", 0) or 0) for f in fields)


def get_label_embeddings(model_name: str, prompts: tuple[str, ...]) -> np.ndarray:
    """The text tower's embeddings of the prompts ``(K, D)``, from vitviz's one cache of them
    (:func:`vitviz.models.zeroshot.text_embeddings`: only prompts not seen before run the text tower, in the
    queue)."""
    loaded = get_model(model_name)
    return in_queue(lambda: text_embeddings(loaded, prompts))


SUGGESTED_LABELS = "cat, dog, car, bird, airplane"


def labels_of(model: LoadedModel, text: str | None, template: str | None) -> Labels | None:
    """A zero-shot model's labels from what was typed (None: its suggestion) and the template (None: its own).

    None for a classifier or backbone, and when the text does not parse.
    """
    if not model.zero_shot:
        return None
    try:
        return parse_labels(*label_defaults(model, text, template))
    except ZeroShotError:
        return None


def label_defaults(model: LoadedModel, text: str | None, template: str | None) -> tuple[str, str]:
    """(labels text, prompt template) of a zero-shot model: what was typed, else the model's suggestions."""
    return (
        text if text is not None else model.text.labels or SUGGESTED_LABELS,
        template if template is not None else model.text.template,
    )


@dataclass(frozen=True)
class Classes:
    """What "class" means for the current model: its classifier's classes, or the labels a user typed."""

    ranked: tuple[Prediction, ...]  # every class, most probable first
    legend: str
    labels: Labels | None = None  # zero-shot models
    rule: str = "softmax"

    def prompt(self, index: int) -> str | None:
        return None if self.labels is None else self.labels.prompts[index]

    def target(self, index: int, minus: int | None = None) -> Target:
        """Class or label ``index`` (minus ``minus``) as the ``Target`` the methods explain: a label's score for a
        zero-shot model, else a class logit."""
        return Target.of_label(self.labels, index, minus) if self.labels else Target.of_class(index, minus)

    def rerank(self, logits: np.ndarray, id2label: dict[int, str] | None) -> tuple[Prediction, ...]:
        """The same classes ranked by other logits (after a knock-out), probabilities by the same rule."""
        if self.labels is None:
            return predictions_from_logits(logits, id2label)
        return rank(from_logits(logits, self.rule), self.labels.names)


def classes(cur: Current) -> Classes | None:
    """The ranked classes of the pane's image (``cur.labels`` for zero-shot models), or None (a backbone, or labels
    that do not parse)."""
    if cur.model.zero_shot:
        labels = cur.labels
        if labels is None or cur.cap.image_embedding is None:
            return None
        scores = score(
            cur.model.model,
            cur.model.text,
            cur.cap.image_embedding,
            get_label_embeddings(cur.model.name, labels.prompts),
        )
        return Classes(rank(scores, labels.names), legend(scores.rule), labels, scores.rule)
    if cur.cap.logits is None:
        return None
    return Classes(predictions_from_logits(cur.cap.logits, cur.model.id2label), "softmax of the logits")


def last_results_path() -> Path | None:
    """The last local ``evaluate`` run's results file; never on a public server (it names the server's files)."""
    if serve_settings().public:
        return None
    from vitviz.evaluate.results import last_run

    return last_run()


def init_state() -> None:
    for key, value in DEFAULTS.items():
        if key not in st.session_state:
            st.session_state[key] = value
    if st.session_state.image_bytes is None:
        set_image((EXAMPLES / st.session_state.image_name).read_bytes(), st.session_state.image_name)


def set_model(name: str) -> None:
    """Make ``name`` the session's model; everything that belonged to the previous one goes back to its default."""
    ss = st.session_state
    ss.model_name = name
    for key in MODEL_STATE:
        ss[key] = DEFAULTS[key]
    for key in MODEL_REQUESTS:
        ss.pop(key, None)


def set_image(data: bytes, name: str, size: tuple[int, int] | None = None, *, class_index: int | None = None) -> None:
    """Make ``data`` the session's image; its digest and (w, h) are kept so reruns never rehash or decode it.

    The explained class becomes ``class_index`` when given, else the new image's top-1 unless the
    user pinned a class.
    """
    if size is None:
        size = read_image(data, max_bytes=upload_limit()).image.size
    ss = st.session_state
    ss.image_bytes, ss.image_name, ss.image_digest, ss.image_wh = data, name, digest(data), size
    ss.query = None  # the model's default: CLS, else the pooled query
    if class_index is not None:
        ss.class_index = int(class_index)
    elif not ss.get("class_pinned", False):
        ss.class_index = None  # the new image's top-1


def _copy(src: str, dst: str) -> None:
    st.session_state[dst] = st.session_state[src]


def keep(state_key: str) -> dict:
    """Widget kwargs that bind it to a persistent session value.

    Streamlit forgets a widget's state on pages that do not draw it; the value lives
    under ``state_key`` instead, and the widget (key ``_w_<state_key>``) mirrors it.
    """
    wkey = f"_w_{state_key}"
    st.session_state[wkey] = st.session_state[state_key]
    return {"key": wkey, "on_change": _copy, "args": (wkey, state_key)}


def clamp_state(cap: vcapture.Capture) -> None:
    """Keep block, head and query inside the current capture (models differ in depth, stages and tokens)."""
    ss = st.session_state
    if ss.layer is None or not 0 <= ss.layer < cap.num_blocks:
        ss.layer = cap.num_blocks - 1
    if not 0 <= ss.head < cap.blocks[ss.layer].num_heads:
        ss.head = 0
    if ss.query is None or not 0 <= ss.query_stage < len(cap.stages):
        ss.query_stage, ss.query = 0, cap.default_query(0)
    if ss.query != POOLED and not 0 <= ss.query < cap.stages[ss.query_stage].num_tokens:
        ss.query = cap.default_query(ss.query_stage)
    rr = ss.rollout_range
    if rr is None or not (0 <= rr[0] <= rr[1] < cap.num_blocks):
        ss.rollout_range = (0, cap.num_blocks - 1)


def query_at(cap: vcapture.Capture, stage: int) -> int:
    """The session's query carried to ``stage``: same prefix token, the cell at the same pixel, or pooled."""
    ss = st.session_state
    return cap.carry_query(ss.query, ss.query_stage, stage)


def set_query(stage: int, token: int) -> None:
    st.session_state.update(query=int(token), query_stage=int(stage))


def pick_query(stage: int, drawn_for: int, key: str) -> None:
    """``on_change`` of a query box drawn for query ``drawn_for``: set the query it shows, unless the
    session's query has moved on since it was drawn.

    A click on a map during a rerun reaches the server with the browser's stale copy of the box drawn
    before (its key names the old query); taken at face value, that box's "change" put the old query back
    and the click was lost (issue 22.4).
    """
    ss = st.session_state
    if ss.get("_query_drawn") == (stage, drawn_for):  # the box the page drew last
        set_query(stage, ss[key])


def query_box_key(stage: int, query: int) -> str:
    """A query box's key: it names the query it was drawn for (so a new query draws a new box at its value)."""
    st.session_state["_query_drawn"] = (stage, query)
    return f"query_pick_{stage}_{query}"


def click_query(cap: vcapture.Capture, stage: int, data: list) -> None:
    """A click on a map cell: customdata ``[token, row, col, value, x, y]``; the pixel picks the stage's token."""
    set_query(stage, cap.token_at(stage, float(data[4]), float(data[5])))


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class PaneState:
    """What one pane shows: a model, an image, the input size asked for and, for zero-shot models, the labels.

    The session's own pane is :func:`state_from_session`; a page draws a second pane from a copy with one
    thing changed (``dataclasses.replace``, :meth:`with_image`) and :func:`current_of`.
    """

    model_name: str
    image_bytes: bytes = field(repr=False)
    image_digest: str
    input_size: tuple[int, int] | None = None  # None: the model's own
    labels_text: str | None = None  # zero-shot models: what was typed (None: the model's suggestion)
    template: str | None = None  # zero-shot models: the prompt template (None: the model's own)

    def with_image(self, data: bytes) -> PaneState:
        return replace(self, image_bytes=data, image_digest=digest(data))

    def with_model(self, name: str) -> PaneState:
        """Another model at its own input size, with its own labels (what belongs to a model does not carry over)."""
        return replace(self, model_name=name, input_size=None, labels_text=None, template=None)


def state_from_session() -> PaneState:
    """The sidebar's model, image, input size and labels."""
    ss = st.session_state
    return PaneState(ss.model_name, ss.image_bytes, ss.image_digest, ss.input_size, ss.labels_text, ss.template)


@dataclass(frozen=True)
class Current:
    """One pane's model and capture (and its labels): what every view draws from."""

    model: LoadedModel
    cap: vcapture.Capture
    key: tuple[str, str, tuple[int, int] | None]  # (model name, image digest, requested size)
    image_bytes: bytes
    labels: Labels | None = None  # zero-shot models: the pane's labels (None: a classifier, or text that won't parse)


def current_of(state: PaneState, *, name: str = "") -> Current | None:
    """The model and capture of ``state`` (no session state read); shows the error and returns None.

    ``name``: what the error message starts with (e.g. "Pane B").
    """
    whose = f"{name}'s" if name else "the"
    try:
        model = get_model(state.model_name)
        with st.spinner(f"Running {whose} model…"):
            cap = get_capture(state.model_name, state.image_digest, state.input_size, state.image_bytes)
    except VitvizError as exc:
        st.error(f"{name}: {exc}" if name else str(exc))
        return None
    labels = labels_of(model, state.labels_text, state.template)
    return Current(model, cap, (state.model_name, state.image_digest, state.input_size), state.image_bytes, labels)


def current() -> Current | None:
    """The model and capture for the session's image, model and size; shows the error and returns None."""
    return current_of(state_from_session())


def require_current() -> Current:
    leave_folder_mode()  # a page reached directly as a server's first request
    cur = current()
    if cur is None:
        st.stop()
    return cur


# Plotly takes two clicks within ``doubleClickDelay`` (300 ms) for a double click, which clears the
# selection: a user's second click 120 ms after the first was lost. Two clicks count as one double
# click only within this many ms.
DOUBLE_CLICK_MS = 60


def chart(fig, *, key: str, **kwargs):
    """``st.plotly_chart`` without Streamlit's Plotly theme, each quick click its own selection.

    The theme replaces a figure's own colour scale (Inferno's near-black bottom rendered pink), so
    every figure is drawn with the scale it names. A clickable chart (``on_select="rerun"``) is
    ``click_chart.clickable_chart``: its element outlives the figure, so the last of quick clicks wins.
    """
    from vitviz.figures import fit_text

    fit_text(fig)  # tick labels, axis titles and long titles inside the figure at any column width
    config = {"doubleClickDelay": DOUBLE_CLICK_MS, **kwargs.pop("config", {})}
    if kwargs.get("on_select") == "rerun":  # a clickable map: one element for the page's life, the last click wins
        return click_chart.clickable_chart(fig, key=key, config=config)
    return st.plotly_chart(fig, key=key, theme=None, config=config, **kwargs)


def clicked_point(event) -> list | None:
    """The ``customdata`` of the point a user clicked in a clickable chart (``chart(..., on_select="rerun")``)."""
    try:
        points = event["selection"]["points"]
    except (KeyError, TypeError):
        return None
    for point in points or []:
        data = point.get("customdata")
        if isinstance(data, dict):  # the browser sends numpy-array rows as {"0": .., "1": ..}
            data = [data[k] for k in sorted(data, key=int)]
        if data is not None:
            return list(data)
    return None


def take_click(chart_key: str, apply) -> None:
    """Apply a new click on chart ``chart_key`` (read before the widgets it drives are drawn).

    A click is new when its point, or its click id (``click_chart``: one per click), differs from the
    last one applied: a second click on the same cell counts too (say after the query box moved on).
    """
    seen = f"_seen_{chart_key}"
    event = st.session_state.get(chart_key)
    data = clicked_point(event)
    if data is None:
        st.session_state.pop(seen, None)
        return
    mark = repr((data, [p.get("click") for p in event["selection"]["points"] if isinstance(p, dict)]))
    if st.session_state.get(seen) != mark:
        st.session_state[seen] = mark
        apply(data)


def npz_bytes(**arrays: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.savez_compressed(buf, **arrays)
    return buf.getvalue()


def downloads(stem: str, key: str, *, csv: Mapping[str, np.ndarray] | None = None, **arrays: np.ndarray) -> None:
    """NPZ of all arrays and a CSV with a header row; PNG comes from each figure's camera button.

    ``csv``: the table's columns, named with their units (every plotted series); by default the
    first array written long (one row per value, its indices first). The files are built only
    when a button is clicked (callables): compressing a T x T attention matrix on every rerun
    would cost ~0.3 s at T = 1370. ``on_click="ignore"``: a download starts no rerun, so a second
    click right after the first starts its own download.
    """
    if csv is None:
        name, first = next(iter(arrays.items()))
        dims = ("row", "col") if first.ndim == 2 else tuple(f"axis {i}" for i in range(first.ndim))
        csv = long_table(first, dims, name)
    c1, c2 = st.columns(2)
    c1.download_button(
        "Download NPZ",
        lambda: npz_bytes(**arrays),
        f"{stem}.npz",
        "application/octet-stream",
        key=f"{key}-npz",
        on_click="ignore",
    )
    c2.download_button(
        "Download CSV", lambda: csv_bytes(csv), f"{stem}.csv", "text/csv", key=f"{key}-csv", on_click="ignore"
    )


def model_options() -> list[str]:
    """The models offered in the sidebar: the presets locally, the allowlist in public mode."""
    settings = serve_settings()
    if not settings.public:
        return list(PRESETS)
    from vitviz.serve.offline import offered

    # a visitor can neither download nor copy a model: with the hub out of reach, offer what loads without it
    return list(offered(allowlist(settings, PRESETS), hub_online()))
