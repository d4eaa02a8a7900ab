"""vitviz in a notebook: ``vitviz.run(model, image)`` and ``vitviz.show(run, view)``.

>>> import vitviz
>>> r = vitviz.run("demo", "photo.jpg")      # one forward pass, kept in ``r.capture``
>>> vitviz.show(r)                            # the instant head view (layer, head, query switch in the browser)
>>> vitviz.show(r, "rollout")                 # the same Plotly figure the app draws

``show`` returns the app's own figure builders' output (``plotly.graph_objects.Figure``),
except for ``"heads"``: a :class:`HeadView`, whose HTML page holds every layer x head
map and redraws without calling Python (:mod:`vitviz.figures.headview`). A frontend that
runs no JavaScript shows its one-line text instead; ``HeadView.figure()`` is the static
Plotly version. A record too large for the page (:data:`~vitviz.figures.headview.DEFAULT_MAX_BYTES`)
or a hierarchical model gets the static figure and a note saying why.
"""

from __future__ import annotations

import functools
import html
import threading
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import plotly.graph_objects as go
    from PIL import Image

    from vitviz.models.load import LoadedModel
    from vitviz.record import Capture

__all__ = ["VIEWS", "HeadView", "NotebookRun", "run", "show"]

VIEWS = ("heads", "heads-static", "rollout", "relevance", "predictions", "positions", "tokens")


@dataclass(frozen=True, eq=False)
class NotebookRun:
    """One model on one image: the loaded model, the RGB image and the record of its forward pass."""

    loaded: LoadedModel = field(repr=False)
    image: Image.Image = field(repr=False)
    capture: Capture = field(repr=False)
    _explained: dict = field(default_factory=dict, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __repr__(self) -> str:
        c = self.capture
        top = c.predictions[0].label if c.predictions else "no classifier"
        return (
            f"NotebookRun(model={c.model_name!r}, family={c.family!r}, input={c.input_size[0]}x{c.input_size[1]}, "
            f"blocks={c.num_blocks}, heads={c.num_heads}, top-1={top!r})"
        )

    def relevance(self, class_index: int | None = None):
        """Chefer et al. relevance for a class logit (default: the top-1), computed once per class."""
        from vitviz.capture.gradients import explain_classes

        c = self.capture.predictions[0].index if class_index is None else int(class_index)
        with self._lock:
            if c not in self._explained:
                size = self.capture.input_size
                self._explained[c] = explain_classes(self.loaded, self.image, [c], size=size)[c]
            return self._explained[c]


@functools.lru_cache(maxsize=4)
def _model(name: str, device: str | None) -> LoadedModel:
    from vitviz.models.load import load_model

    return load_model(name, device=device)


def run(
    model: str | LoadedModel,
    image: str | Path | Image.Image | bytes | np.ndarray,
    *,
    size: int | tuple[int, int] | None = None,
    device: str | None = None,
) -> NotebookRun:
    """Load ``model`` (``demo``, a folder or a hub id; loads are cached) and capture one forward pass of ``image``.

    ``image``: a path, encoded bytes, a PIL image or an ``(h, w, 3)`` uint8 array.
    ``size``: the model input (default: the model's own). Raises vitviz's errors
    (``ModelLoadError``, ``ImageError``, ...) with a message saying what to do.
    """
    from PIL import Image as PILImage

    from vitviz.capture.forward import capture
    from vitviz.data.images import load_image

    loaded = _model(model, device) if isinstance(model, str) else model
    if isinstance(image, np.ndarray):
        image = PILImage.fromarray(np.ascontiguousarray(image, dtype=np.uint8)).convert("RGB")
    rgb = load_image(image)
    return NotebookRun(loaded, rgb, capture(loaded, rgb, size=size))


@dataclass(frozen=True)
class HeadView:
    """The instant head view of a record: HTML for a notebook, with the static figure as a fallback."""

    html: str = field(repr=False)
    capture: Capture = field(repr=False)
    height: int = 640

    def _repr_html_(self) -> str:
        # an iframe keeps the page's script and styles apart from the notebook's
        return (
            f'<iframe srcdoc="{html.escape(self.html, quote=True)}" style="width:100%;height:{self.height}px;'
            'border:0" sandbox="allow-scripts allow-downloads"></iframe>'
        )

    def _repr_mimebundle_(self, include=None, exclude=None) -> dict[str, str]:
        return {"text/html": self._repr_html_(), "text/plain": _NO_JS}

    def save(self, path: str | Path) -> Path:
        """Write the page as a standalone HTML file (it needs no server)."""
        out = Path(path)
        out.write_text(self.html, encoding="utf-8")
        return out

    def figure(self, *, layer: int | None = None, query: int | None = None) -> go.Figure:
        """The static version: every head of one layer (default: the last) for one query (default: CLS)."""
        return _heads_static(self.capture, layer=layer, query=query)


_NO_JS = (
    "vitviz head view: this frontend runs no JavaScript; use vitviz.show(run, 'heads-static') for the Plotly figure"
)


def show(target: NotebookRun | Capture, view: str = "heads", **options: Any) -> HeadView | go.Figure:
    """Draw ``view`` of a run (or a bare capture record): one of :data:`VIEWS`.

    Options: ``heads-static``: ``layer``, ``query``; ``rollout``: ``start``, ``stop``,
    ``fusion`` ("mean", "max", "min"), ``discard`` (ratio); ``relevance``: ``class_index``
    (needs a run, not a bare record). ``positions``: the cosine similarity of the learned position
    embeddings (the ViT paper's Figure 7, centre).
    """
    if view not in VIEWS:
        raise ValueError(f"unknown view {view!r}: choose one of {', '.join(VIEWS)}")
    cap = target.capture if isinstance(target, NotebookRun) else target
    if view == "heads":
        return _heads(cap, **options)
    if view == "heads-static":
        return _heads_static(cap, **options)
    if view == "rollout":
        return _rollout(cap, **options)
    if view == "relevance":
        if not isinstance(target, NotebookRun):
            raise ValueError("relevance needs the model: pass the run from vitviz.run(), not a bare record")
        return _relevance(target, **options)
    if view == "predictions":
        from vitviz import figures

        if not cap.predictions:
            raise ValueError(f"{cap.model_name} is a backbone without a classifier: it makes no predictions")
        return figures.predictions_figure(cap.predictions)
    if view == "positions":
        return _positions(cap, **options)
    from vitviz import figures

    return figures.token_sequence_figure(cap.token_kinds, cap.grid)


def _heads(cap: Capture, *, height: int = 640, max_bytes: int | None = None) -> HeadView | go.Figure:
    from vitviz.figures.headview import DEFAULT_MAX_BYTES, head_view_data, head_view_html, record_problem

    stack = cap.attention_stack
    problem = record_problem(cap)
    if not problem:
        try:
            data = head_view_data(
                stack,
                grid=cap.grid,
                prefix_kinds=cap.prefix_kinds,
                image=cap.image,
                title=f"{cap.model_name}: attention heads",
                layer_names=[cap.block_label(b) for b in range(cap.num_blocks)],
                max_bytes=max_bytes or DEFAULT_MAX_BYTES,
            )
            return HeadView(head_view_html(data, height=height - 20), cap, height)
        except ValueError as exc:  # HeadViewTooLarge is one
            problem = str(exc)
    warnings.warn(f"vitviz: showing the static head figure: {problem}", stacklevel=3)
    return _heads_static(cap)


def _heads_static(cap: Capture, *, layer: int | None = None, query: int | None = None) -> go.Figure:
    from vitviz import figures
    from vitviz.analysis.blocks import head_maps

    b = cap.num_blocks - 1 if layer is None else int(layer)
    block = cap.blocks[b]
    q = cap.default_query(block.stage) if query is None else int(query)
    maps = head_maps(block, q)
    return figures.small_multiples_figure(
        maps.values,
        [f"head {h}" for h in range(block.num_heads)],
        colorbar_title="attention (raw)",
        image=cap.image,
    ).update_layout(title=f"{cap.block_label(b)}: where {cap.token_label(q, block.stage)} looks, every head")


def _rollout(
    cap: Capture, *, start: int = 0, stop: int | None = None, fusion: str = "mean", discard: float = 0.0
) -> go.Figure:
    from vitviz import figures
    from vitviz.analysis.rollout import capture_rollout

    row, s = capture_rollout(cap, start=start, stop=stop, fusion=fusion, discard_ratio=discard)
    stage = cap.stages[s]
    end = cap.num_blocks - 1 if stop is None else stop - 1
    return figures.map_figure(
        cap.image,
        row[stage.num_prefix :].reshape(stage.grid),
        title=f"Rollout of what {cap.model_name} reads, blocks {start}-{end}",
        colorbar_title="rollout (raw)",
    )


def _relevance(r: NotebookRun, *, class_index: int | None = None) -> go.Figure:
    from vitviz import figures

    exp = r.relevance(class_index)
    return figures.map_figure(
        r.capture.image,
        exp.patch_map(),
        title=f"Relevance for '{exp.label}' (Chefer et al. 2021)",
        colorbar_title="relevance (raw)",
    )


def _positions(cap: Capture) -> go.Figure:
    from vitviz import figures
    from vitviz.analysis.embeddings import position_similarity

    if not cap.position.tables:
        raise ValueError(f"{cap.model_name} has no learned position embeddings: {cap.position_note}")
    table = cap.position.tables[0]
    return figures.position_similarity_figure(position_similarity(table.embeddings), table.grid)
