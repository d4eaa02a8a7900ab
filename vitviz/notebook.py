"""vitviz in a notebook: ``vitviz.run(model, image)`` and ``vitviz.show(run, view)``.

>>> import vitviz
>>> r = vitviz.run("demo", "photo.jpg")      # the engine's Run: one forward pass (r.capture, r.scores, ...)
>>> vitviz.show(r)                            # the instant head view (layer, head, query switch in the browser)
>>> vitviz.show(r, "rollout")                 # the same Plotly figure the app draws
>>> z = vitviz.run("demo-clip", "photo.jpg", labels="star, circle")   # a zero-shot model scores typed labels
>>> vitviz.show(z, "relevance", label="star")

:func:`run` returns the engine's :class:`~vitviz.capture.run.Run` (``vitviz.capture.run.get_run``): the
record every view reads (``run.capture``), the scores (class logits, or a zero-shot model's label scores),
the named points (``run.activation("blocks.3.out")``) and edited forwards (``run.edited(...)``). For a
zero-shot model ``run.labels`` holds the labels its scores are for (names, prompts, template).

``show`` returns the app's own figure builders' output (``plotly.graph_objects.Figure``),
except for ``"heads"``: a :class:`HeadView`, whose HTML page holds every layer x head
map and redraws without calling Python (:mod:`vitviz.figures.headview`). Where scripts do
not run (an untrusted notebook, a viewer that strips scripts) the same output shows the
last layer's heads as a static picture and says how to trust the notebook; in plain Python
``HeadView.save(path)`` writes the page and ``HeadView.open()`` shows it in the browser.
``HeadView.figure()`` is the static Plotly version. A record too large for the page
(``max_bytes``, default :data:`~vitviz.figures.headview.DEFAULT_MAX_BYTES`) or a
hierarchical model gets the static figure and a warning saying why.

Every input is checked before any work: a bad image, size, label, view or option is one
:class:`~vitviz.errors.VitvizError` whose message says what to give instead.
"""

from __future__ import annotations

import base64
import dataclasses
import difflib
import functools
import html
import io
import math
import numbers
import tempfile
import uuid
import warnings
import webbrowser
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from vitviz.errors import VitvizError

if TYPE_CHECKING:
    import plotly.graph_objects as go
    from PIL import Image

    from vitviz.capture.run import Run
    from vitviz.models.load import LoadedModel
    from vitviz.models.zeroshot import Labels
    from vitviz.record import Capture

__all__ = ["VIEWS", "OPTIONS", "DEFAULT_OPACITY", "NotebookError", "HeadView", "run", "show"]

VIEWS = (
    "heads",
    "heads-static",
    "rollout",
    "relevance",
    "predictions",
    "positions",
    "tokens",
    "features",
    "feature-card",
)
CARD_PARTS = ("examples", "histogram", "effect")  # the feature card's figures (show(run, "feature-card", part=...))
# The options each view takes (``show(run, view, **options)``); anything else is refused, naming these.
OPTIONS: dict[str, tuple[str, ...]] = {
    "heads": ("height", "max_bytes", "opacity"),
    "heads-static": ("block", "query", "layer"),  # layer: the older name of block
    "rollout": ("start", "stop", "fusion", "discard", "opacity"),
    "relevance": ("class_index", "label", "opacity"),
    "predictions": ("top",),
    "positions": ("block",),
    "tokens": (),
    "features": ("sae", "feature", "opacity"),
    "feature-card": ("sae", "index", "feature", "part"),
}
DEFAULT_OPACITY = 0.6  # of a map over the photo: the photo stays visible (1 hides it)


class NotebookError(VitvizError, ValueError):
    """A view, an option or a value the notebook API cannot use; the message says what it takes."""


_MODELS = None  # the models `run` loaded by name: a BoundedCache, made on first use (keeps `import vitviz` light)
NOTEBOOK_MODELS = 4  # at most this many models by name ...
NOTEBOOK_MODEL_BYTES = 8 * 2**30  # ... and this many bytes of parameters (a larger model is kept alone)


def _model(name: str, device: str | None) -> LoadedModel:
    global _MODELS
    from vitviz.cache import BoundedCache
    from vitviz.models.load import load_model
    from vitviz.serve.models import model_nbytes

    if _MODELS is None:
        _MODELS = BoundedCache(
            max_entries=NOTEBOOK_MODELS, max_bytes=NOTEBOOK_MODEL_BYTES, size_of=model_nbytes, keep_oversize=True
        )
    return _MODELS.get_or_compute((name, device), lambda: load_model(name, device=device))


def run(
    model: str | LoadedModel,
    image: str | Path | Image.Image | bytes | np.ndarray,
    *,
    size: int | tuple[int, int] | None = None,
    labels: str | Sequence[str] | None = None,
    template: str | None = None,
    device: str | None = None,
) -> Run:
    """Load ``model`` and run one forward pass of ``image``: the engine's :class:`~vitviz.capture.run.Run`.

    Args:
        model: ``"demo"`` (or ``"demo-swin"``, ``"demo-clip"``: the bundled models), a folder written by
            ``save_pretrained``, a hub id in the local cache, or a :class:`~vitviz.models.load.LoadedModel`.
            Loads are cached (the last four).
        image: a path to an image file (regular files of at most 200 MB; URLs are refused: download first),
            encoded bytes, a PIL image, or an array: ``(h, w)``, ``(h, w, c)`` or ``(c, h, w)`` with 1, 3 or 4
            channels, ``uint8`` (or integers) in 0..255 or floats in 0..1
            (:func:`vitviz.data.images.image_from_array`). The pixel limits of the app apply.
        size: the model input, one side (a square) or ``(h, w)``, as the command line's ``--size``: each side
            1 to 8192 pixels and at least one patch of the model (default: the model's own).
        labels: zero-shot models (CLIP, SigLIP): the labels scored, ``"cat, dog, car"`` (comma- or
            newline-separated, as the command line's ``--labels``) or a list of them.
        template: the prompt made from each label, ``{}`` is the label (default: the model's own, else
            ``"a photo of a {}."``; ``"{}"`` uses the labels as they are).
        device: ``cuda``, ``mps`` or ``cpu`` (default: the best available).

    Returns:
        The :class:`~vitviz.capture.run.Run` (cached by the engine: views of one image share one forward),
        with ``labels`` set for a zero-shot model given ``labels``.

    Raises:
        VitvizError: ``ModelLoadError``, ``ImageError``, ``UsageError`` (size), ``ZeroShotError`` (labels),
            ``BudgetError`` ..., each with a message saying what to do.
    """
    with warnings.catch_warnings():
        # tqdm.auto, imported by transformers and the hub, warns in a kernel without ipywidgets that its bars
        # will be text: vitviz shows no bar while loading (the download bars, where there are any, still work)
        warnings.filterwarnings("ignore", message="IProgress not found")
        from vitviz.capture.run import get_run
        from vitviz.data.images import load_image
        from vitviz.models.load import LoadedModel

        if isinstance(model, str):
            loaded = _model(model, device)
        elif isinstance(model, LoadedModel):
            loaded = model
        else:
            raise NotebookError(
                f"model is a name ('demo', a folder, a hub id) or a loaded model; got {type(model).__name__}."
            )
    hw = _size(size, loaded)  # before the image is read: a bad size costs nothing
    parsed = _labels(loaded, labels, template)
    rgb = load_image(image)
    if parsed is None:
        return get_run(loaded, rgb, size=hw)
    # A copy of the cached run with the labels as parsed (their template and notes: the cache keys runs by the
    # labels' names and prompts only).
    return dataclasses.replace(get_run(loaded, rgb, size=hw, labels=parsed), labels=parsed)


def _size(size: Any, loaded: LoadedModel) -> int | tuple[int, int] | None:
    """``size`` checked as the command line checks ``--size`` (the same messages, with ``size`` for the option)."""
    from vitviz.cli_checks import check_against_model, input_size

    if size is None:
        return None
    sides = list(size) if isinstance(size, (tuple, list)) else [size]
    if isinstance(size, (tuple, list)) and len(sides) != 2:
        raise NotebookError(f"size is one number (a square, e.g. 224) or two, (h, w); got {size!r}.")
    if not all(isinstance(s, numbers.Integral) and not isinstance(s, bool) for s in sides):
        raise NotebookError(f"size is one side in pixels (e.g. 224) or (h, w); got {size!r}.")
    checked = input_size([int(s) for s in sides], option="size")
    check_against_model(loaded, checked, None, option_size="size")
    return checked


def _labels(loaded: LoadedModel, labels: Any, template: str | None) -> Labels | None:
    """The parsed labels (None without ``labels``); warnings for what was changed or is unknown to the tokenizer."""
    from vitviz.models.zeroshot import ZeroShotError, parse_labels, vocabulary_warning

    if labels is None:
        if template is not None:
            raise NotebookError("template= shapes the prompts of labels=: give labels too.")
        return None
    if not loaded.zero_shot:
        raise ZeroShotError(
            loaded.text_note
            or f"'{loaded.name}' has no text tower: labels= needs a CLIP- or SigLIP-style two-tower model "
            "(e.g. 'demo-clip'). Leave labels out for this model."
        )
    if isinstance(labels, str):
        text = labels
    elif isinstance(labels, Sequence) and all(isinstance(x, str) for x in labels):
        text = "\n".join(labels) if len(labels) > 1 else "".join(labels)
    else:
        raise NotebookError(f"labels is a string ('cat, dog') or a list of strings; got {type(labels).__name__}.")
    if template is not None and not isinstance(template, str):
        raise NotebookError(f"template is a string with {{}} where the label goes; got {type(template).__name__}.")
    parsed = parse_labels(text, loaded.text.template if template is None else template)
    for note in parsed.notes:
        warnings.warn(f"vitviz: {note}", stacklevel=3)
    unknown = vocabulary_warning(loaded.text, parsed, loaded.name)
    if unknown:
        warnings.warn(f"vitviz: {unknown}", stacklevel=3)
    return parsed


# --- show -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class HeadView:
    """The instant head view of a record: a standalone HTML page, shown by a notebook, saved or opened elsewhere.

    In a notebook the output holds the page (in an ``iframe``) and, for frontends that run no script (an
    untrusted notebook, a viewer), a static picture of the last layer's heads with a note saying how to trust
    the notebook. Elsewhere: :meth:`save` writes the page, :meth:`open` shows it in the browser, and
    :meth:`figure` is the static Plotly figure.
    """

    html: str = field(repr=False)
    capture: Capture = field(repr=False)
    height: int = 640

    def __repr__(self) -> str:
        c = self.capture
        return (
            f"<vitviz head view of {c.model_name}: {c.num_blocks} layers x {c.num_heads} heads, "
            f"{len(self.html) / 1e6:.1f} MB page. A notebook shows it; elsewhere .save('heads.html') writes it, "
            ".open() shows it in the browser, .figure() is the static figure>"
        )

    @functools.cached_property
    def png(self) -> bytes:
        """The static picture (PNG bytes): every head of the last layer, the default query's map over the image."""
        return _heads_png(self.capture)

    def _repr_html_(self) -> str:
        # The page in an iframe (its script and styles stay apart from the notebook's), hidden until this output's
        # own script shows it and hides the static picture. Where scripts do not run, the script is dropped (or
        # never runs): the picture and the note stay, and the empty iframe stays hidden.
        uid = f"vitviz-hv-{uuid.uuid4().hex}"
        picture = base64.b64encode(self.png).decode("ascii")
        return (
            f'<div id="{uid}">'
            f'<div class="vitviz-static"><p style="max-width:720px">{html.escape(_UNTRUSTED)}</p>'
            f'<img src="data:image/png;base64,{picture}" alt="the last layer\'s heads, static" '
            'style="max-width:100%"></div>'
            f'<iframe srcdoc="{html.escape(self.html, quote=True)}" style="display:none;width:100%;'
            f'height:{self.height}px;border:0" sandbox="allow-scripts allow-downloads"></iframe>'
            f'<script>(function(){{var r=document.getElementById("{uid}");if(!r)return;'
            'r.querySelector(".vitviz-static").style.display="none";'
            'r.querySelector("iframe").style.display="block";})();</script></div>'
        )

    def _repr_mimebundle_(self, include=None, exclude=None) -> dict[str, str]:
        # A frontend picks the richest type it renders: the page (text/html), else the picture, else the text.
        return {
            "text/html": self._repr_html_(),
            "image/png": base64.b64encode(self.png).decode("ascii"),
            "text/plain": f"{self!r}\n{_NO_JS}",
        }

    def save(self, path: str | Path) -> Path:
        """Write the page as a standalone HTML file (it needs no server and no network); returns the path."""
        out = Path(path)
        out.write_text(self.html, encoding="utf-8")
        return out

    def open(self) -> Path:
        """Write the page to a temporary file and open it in the default browser (:mod:`webbrowser`); returns
        the file's path (it is left for the browser to read)."""
        with tempfile.NamedTemporaryFile("w", suffix=".html", prefix="vitviz-heads-", delete=False) as f:
            f.write(self.html)
        path = Path(f.name)
        webbrowser.open(path.as_uri())
        return path

    def figure(self, *, block: int | None = None, query: int | None = None, layer: int | None = None) -> go.Figure:
        """The static version: every head of one block (0-based, default: the last; ``layer``: its older name) for
        one query (default: CLS)."""
        return _heads_static(self.capture, block=block, layer=layer, query=query)


_UNTRUSTED = (
    "The interactive head view needs JavaScript, which does not run here: this notebook is not trusted (it was "
    "executed elsewhere, e.g. by nbconvert, or received from someone), or this viewer runs no scripts. To trust "
    "it: File > Trust Notebook in Jupyter (or jupyter trust NOTEBOOK.ipynb), then rerun the cell. Below: the last "
    "layer's heads, static."
)
_NO_JS = (
    "This frontend shows no HTML: HeadView.save('heads.html') writes the page, HeadView.open() opens it in a "
    "browser, vitviz.show(run, 'heads-static') is the static figure."
)


def show(target: Run | Capture, view: str = "heads", **options: Any) -> HeadView | go.Figure:
    """Draw ``view`` of a run (or of a bare capture record): one of :data:`VIEWS`.

    Options (:data:`OPTIONS`; anything else is refused with the list):

    * ``heads``: ``height`` (pixels, 200..4000, default 640), ``max_bytes`` (the page's limit, default
      8 MB: a larger record, e.g. ``demo`` at 224 px, gets the static figure and a warning naming the size
      it needs; raise it to send the page anyway, and the notebook file keeps it), ``opacity`` of the map
      over the photo (0..1, default 0.6);
    * ``heads-static``: ``block`` (0-based, default: the last; ``layer`` is the same, its older name), ``query``
      (a token index; default: CLS);
    * ``rollout``: ``start``, ``stop`` (blocks ``start..stop-1``), ``fusion`` (``"mean"``, ``"max"``,
      ``"min"``), ``discard`` (ratio in [0, 1)), ``opacity``;
    * ``relevance`` (needs a run, not a bare record): ``class_index`` (a classifier; default: the top-1),
      ``label`` (a zero-shot run: one of its labels, or its index; default: the top-1), ``opacity``;
    * ``predictions``: ``top`` (how many, default 5);
    * ``positions``: the cosine similarity of the learned position embeddings (the ViT paper's Figure 7,
      centre), or for models with relative position biases (Swin) every head's bias of block ``block``;
    * ``tokens``: the token sequence;
    * ``features`` (needs a run): a sparse autoencoder's feature over the image; ``sae`` (required: an SAE folder
      or file, or a loaded :class:`~vitviz.sae.model.SparseAutoencoder`), ``feature`` (default: the feature
      most active on any patch), ``opacity``;
    * ``feature-card`` (needs a run): one figure of the Features page's feature card: ``part`` ``"examples"`` (the
      feature's top examples over the index's data set, its map over each crop; the default), ``"histogram"`` (its
      activation histogram over the data set) or ``"effect"`` (its direct effect on the read-out: the logits, or a
      zero-shot run's labels); ``sae`` (required, as for ``features``), ``index`` (required for ``examples`` and
      ``histogram``: the ``.parquet`` file ``vitviz sae index`` wrote, or a loaded index), ``feature`` (default:
      the feature most active on any patch of the run's image).
    """
    from vitviz.capture.run import Run
    from vitviz.record import Capture

    if not isinstance(view, str) or view not in VIEWS:
        raise NotebookError(f"unknown view {view!r}{_did_you_mean(view, VIEWS)}: choose one of {', '.join(VIEWS)}")
    if isinstance(target, Run):
        cap = target.capture
    elif isinstance(target, Capture):
        cap = target
    else:
        raise NotebookError(f"show draws a run from vitviz.run() (or its .capture); got {type(target).__name__}.")
    unknown = [k for k in options if k not in OPTIONS[view]]
    if unknown:
        takes = f"takes {', '.join(OPTIONS[view])}" if OPTIONS[view] else "takes no options"
        hint = _did_you_mean(unknown[0], OPTIONS[view])
        raise NotebookError(f"show(run, {view!r}) {takes}; got {', '.join(map(repr, unknown))}{hint}.")
    if view == "heads":
        return _heads(cap, **options)
    if view == "heads-static":
        return _heads_static(cap, **options)
    if view == "rollout":
        return _rollout(cap, **options)
    if view == "positions":
        return _positions(cap, **options)
    if view == "tokens":
        from vitviz import figures

        return figures.token_sequence_figure(cap.token_kinds, cap.grid)
    if not isinstance(target, Run):
        raise NotebookError(f"{view} needs the model's scores: pass the run from vitviz.run(), not a bare record")
    if view == "relevance":
        return _relevance(target, **options)
    if view == "features":
        return _features(target, **options)
    if view == "feature-card":
        return _feature_card(target, **options)
    return _predictions(target, **options)


def _sae_of(run: Run, sae: Any, view: str):
    from vitviz.sae import SparseAutoencoder, load_sae

    if sae is None:
        raise NotebookError(f"show(run, {view!r}) needs sae=: an SAE folder (e.g. vitviz/assets/demo-sae) or file")
    if not isinstance(sae, SparseAutoencoder):
        if not isinstance(sae, (str, Path)):
            raise NotebookError(f"sae is an SAE folder, a file or a loaded SparseAutoencoder; got {type(sae).__name__}")
        sae = load_sae(sae, loaded=run.loaded)
    return sae


def _feature_of(run: Run, sae, feature: Any):
    """(the run's features, the feature: the one given, checked, or the most active on any patch)."""
    from vitviz.sae.run import features

    feats = features(run, sae)
    gh, gw = feats.grid
    patches = feats.values[feats.n_prefix : feats.n_prefix + gh * gw]
    if feature is None:
        feature = int(patches.max(dim=0).values.argmax())
    return feats, _index("feature", feature, sae.d_sae, f"the SAE has {sae.d_sae} features")


def _features(run: Run, *, sae: Any = None, feature: Any = None, opacity: Any = DEFAULT_OPACITY) -> go.Figure:
    from vitviz import figures

    sae = _sae_of(run, sae, "features")
    opacity = _fraction("opacity", opacity)
    feats, feature = _feature_of(run, sae, feature)
    gh, gw = feats.grid
    patches = feats.values[feats.n_prefix : feats.n_prefix + gh * gw]
    on = float((patches[:, feature] > 0).float().mean())
    return figures.map_figure(
        run.capture.image,
        feats.map(feature),
        title=f"Feature {feature} of the SAE at {feats.point} (active on {on:.0%} of the patches)",
        colorbar_title="activation",
        opacity=opacity,
    )


def _feature_card(
    run: Run, *, sae: Any = None, index: Any = None, feature: Any = None, part: Any = "examples"
) -> go.Figure:
    """One figure of the feature card (the Features page's): top examples, histogram over the data set, or the
    direct effect on the read-out."""
    from vitviz.figures.features import effects_figure, feature_crops_figure, index_histogram_figure
    from vitviz.sae.card import example_crops, feature_effects, label_effects, readout_for, top_effects
    from vitviz.sae.index import FeatureIndex, load_index

    if part not in CARD_PARTS:
        raise NotebookError(f"part is one of {', '.join(CARD_PARTS)}; got {part!r}{_did_you_mean(part, CARD_PARTS)}")
    sae = _sae_of(run, sae, "feature-card")
    _, feature = _feature_of(run, sae, feature)
    if part == "effect":
        readout = readout_for(run.loaded, sae.cfg.point)
        eff = feature_effects(sae, readout, [feature])
        if readout.kind == "embedding":
            if run.labels is None or run.text_embeddings is None:
                raise NotebookError(
                    "a zero-shot model's direct effect is on its labels' scores: run it with labels= "
                    "(vitviz.run(..., labels=...))."
                )
            eff = label_effects(eff, run.text_embeddings)
            names, what = list(run.labels.names), "direct effect on the label's score (u . t / |t|)"
        else:
            names, what = list(readout.names), "direct effect on the logit"
        pos, neg = top_effects(eff[0], names, n=8)
        return effects_figure(
            pos, neg, title=f"Feature {feature}: direct effect, most positive and negative", what=what
        )
    if index is None:
        raise NotebookError(
            f"show(run, 'feature-card', part={part!r}) needs index=: the .parquet file `vitviz sae index` wrote"
        )
    if not isinstance(index, FeatureIndex):
        if not isinstance(index, (str, Path)):
            raise NotebookError(f"index is a .parquet file or a loaded FeatureIndex; got {type(index).__name__}")
        index = load_index(index, sae, run.loaded)
    e = index.feature(feature)
    if part == "histogram":
        return index_histogram_figure(
            e.histogram, e.edges, feature=feature, frequency=e.frequency, tokens=int(index.meta["tokens"])
        )
    if not e.examples:
        raise NotebookError(f"feature {feature} is never active on the index's images: it has no top examples")
    crops, _ = example_crops(sae, run.loaded, index, feature)
    if not crops:
        raise NotebookError(f"none of feature {feature}'s top examples' images can be read any more")
    return feature_crops_figure(
        [c.image for c in crops],
        [c.title for c in crops],
        title=f"Feature {feature}: its {len(crops)} strongest tokens over the data set",
    )


def _did_you_mean(word: Any, choices: Sequence[str]) -> str:
    close = difflib.get_close_matches(str(word), choices, n=1) if isinstance(word, str) else []
    return f" (did you mean {close[0]!r}?)" if close else ""


def _integer(name: str, value: Any, lo: int, hi: int, what: str) -> int:
    """``value`` as an int in ``lo..hi`` (Python's negative indices from the end when ``lo`` is 0 and the
    range is an index range), else :class:`NotebookError` naming the range."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise NotebookError(f"{name} is a whole number, {lo}..{hi} ({what}); got {value!r}.")
    v = int(value)
    if not lo <= v <= hi:
        raise NotebookError(f"{name}={v}: {what}, so give {lo}..{hi}.")
    return v


def _index(name: str, value: Any, n: int, what: str) -> int:
    """An index into ``n`` things (``-n..n-1``, negatives from the end), else a message naming the range."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise NotebookError(f"{name} is a whole number, 0..{n - 1} ({what}); got {value!r}.")
    v = int(value)
    if not -n <= v < n:
        raise NotebookError(f"{name}={v}: {what}, numbered 0..{n - 1} (or -1 for the last).")
    return v % n


def _fraction(name: str, value: Any, *, below_one: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(float(value)):
        raise NotebookError(f"{name} is a number from 0 to 1; got {value!r}.")
    v = float(value)
    if not (0.0 <= v < 1.0 if below_one else 0.0 <= v <= 1.0):
        raise NotebookError(f"{name}={v:g}: give a number from 0 to {'below 1' if below_one else '1'}.")
    return v


def _layer(cap: Capture, layer: Any, name: str = "layer") -> int:
    n = cap.num_blocks
    return n - 1 if layer is None else _index(name, layer, n, f"{cap.model_name} has {n} blocks")


def _heads(
    cap: Capture, *, height: Any = 640, max_bytes: Any = None, opacity: Any = DEFAULT_OPACITY
) -> HeadView | go.Figure:
    from vitviz.figures.headview import (
        DEFAULT_MAX_BYTES,
        HeadViewTooLarge,
        head_view_data,
        head_view_html,
        record_problem,
    )

    height = _integer("height", height, 200, 4000, "the view's height in pixels")
    limit = DEFAULT_MAX_BYTES if max_bytes is None else _integer("max_bytes", max_bytes, 1, 2**31, "bytes")
    opacity = _fraction("opacity", opacity)
    problem = record_problem(cap)
    if not problem:
        try:
            data = head_view_data(
                cap.attention_stack,
                grid=cap.grid,
                prefix_kinds=cap.prefix_kinds,
                image=cap.image,
                title=f"{cap.model_name}: attention heads",
                layer_names=[cap.block_label(b) for b in range(cap.num_blocks)],
                max_bytes=limit,
            )
            return HeadView(head_view_html(data, height=height - 20, opacity=opacity), cap, height)
        except HeadViewTooLarge as exc:
            need = -(-max(exc.nbytes, limit + 1) // 1_000_000) * 1_000_000
            problem = (
                f"{exc}. vitviz.show(run, max_bytes={need:_}) sends it anyway (the notebook file keeps the page), "
                "or give vitviz.run a smaller size="
            )
        except ValueError as exc:
            problem = str(exc)
    warnings.warn(f"vitviz: showing the static head figure (vitviz.show(run, 'heads-static')): {problem}", stacklevel=3)
    return _heads_static(cap)


def _query(cap: Capture, b: int, query: Any) -> int:
    block = cap.blocks[b]
    if query is None:
        return cap.default_query(block.stage)
    stage = cap.stages[block.stage]
    n = 1 if block.kind == "pool" else stage.num_prefix + stage.grid[0] * stage.grid[1]
    first = f"0..{stage.num_prefix - 1} are {', '.join(stage.prefix_kinds)}, then " if stage.num_prefix else ""
    return _integer(
        "query", query, 0, n - 1, f"{cap.block_label(b)} has {n} query tokens ({first}the patches row by row)"
    )


def _heads_static(cap: Capture, *, block: Any = None, layer: Any = None, query: Any = None) -> go.Figure:
    from vitviz import figures
    from vitviz.analysis.blocks import head_maps

    if block is not None and layer is not None and block != layer:
        raise NotebookError(f"block={block!r} and layer={layer!r} name the same thing: give one")
    b = _layer(cap, layer, "layer") if block is None else _layer(cap, block, "block")
    block = cap.blocks[b]
    q = _query(cap, b, query)
    maps = head_maps(block, q)
    return figures.small_multiples_figure(
        maps.values,
        [f"head {h}" for h in range(block.num_heads)],
        colorbar_title="attention (raw)",
        image=cap.image,
    ).update_layout(title=f"{cap.block_label(b)}: where {cap.token_label(q, block.stage)} looks, every head")


def _heads_png(cap: Capture, tile: int = 160, cols: int = 6) -> bytes:
    """The last layer's heads (the default query's map over the image, bilinear, 60 % opacity) as one PNG."""
    from PIL import Image, ImageDraw

    from vitviz.analysis.blocks import head_maps
    from vitviz.figures.overlay import overlay

    b = cap.num_blocks - 1
    block = cap.blocks[b]
    q = cap.default_query(block.stage)
    maps = head_maps(block, q).values
    cols = max(1, min(cols, len(maps)))
    rows = -(-len(maps) // cols)
    h = round(tile * cap.image.shape[0] / cap.image.shape[1])
    sheet = Image.new("RGB", (cols * tile, rows * (h + 16) + 18), "white")
    draw = ImageDraw.Draw(sheet)
    draw.text((2, 2), f"{cap.model_name}, {cap.block_label(b)}: where {cap.token_label(q, block.stage)} looks", "black")
    for i, m in enumerate(maps):
        r, c = divmod(i, cols)
        x, y = c * tile, 18 + r * (h + 16)
        sheet.paste(overlay(cap.image, m).resize((tile, h)), (x, y + 14))
        draw.text((x + 2, y + 1), f"head {i}", "black")
    buf = io.BytesIO()
    sheet.save(buf, format="PNG")
    return buf.getvalue()


def _rollout(
    cap: Capture,
    *,
    start: Any = 0,
    stop: Any = None,
    fusion: Any = "mean",
    discard: Any = 0.0,
    opacity: Any = DEFAULT_OPACITY,
) -> go.Figure:
    from vitviz import figures
    from vitviz.analysis.rollout import capture_rollout

    if cap.rollout_note:
        raise NotebookError(f"Rollout is not defined for {cap.model_name}: {cap.rollout_note}")
    n = cap.num_blocks
    start = _integer("start", start, 0, n - 1, f"the first block rolled out; {cap.model_name} has {n} blocks")
    stop = n if stop is None else _integer("stop", stop, start + 1, n, "rollout runs through blocks start..stop-1")
    if fusion not in ("mean", "max", "min"):
        raise NotebookError(f"fusion fuses the heads: 'mean', 'max' or 'min'; got {fusion!r}.")
    discard = _fraction("discard", discard, below_one=True)
    opacity = _fraction("opacity", opacity)
    row, s = capture_rollout(cap, start=start, stop=stop, fusion=fusion, discard_ratio=discard)
    stage = cap.stages[s]
    return figures.map_figure(
        cap.image,
        row[stage.num_prefix :].reshape(stage.grid),
        title=f"Rollout of what {cap.model_name} reads, blocks {start}-{stop - 1}",
        colorbar_title="rollout (raw)",
        opacity=opacity,
    )


def _no_scores(r: Run, what: str) -> NotebookError:
    loaded = r.loaded
    if loaded.zero_shot:
        example = loaded.text.labels or "cat, dog, car"
        return NotebookError(
            f"'{loaded.name}' is a zero-shot model: {what} needs labels to score, e.g. "
            f"vitviz.run({loaded.name!r}, image, labels={example!r})."
        )
    return NotebookError(f"'{loaded.name}' is a backbone without a classifier: it has no {what}.")


def _top(r: Run) -> int:
    return int(np.argmax(r.scores.numpy()))


def _relevance(r: Run, *, class_index: Any = None, label: Any = None, opacity: Any = DEFAULT_OPACITY) -> go.Figure:
    from vitviz import figures
    from vitviz.capture.gradients import explain_run
    from vitviz.capture.targets import Target
    from vitviz.errors import CaptureError

    opacity = _fraction("opacity", opacity)
    loaded = r.loaded
    note = loaded.family.rollout_note(loaded.config)
    if note:
        raise NotebookError(f"Relevance is not defined for {loaded.family.name}: {note}")
    if r.labels is not None:
        if class_index is not None:
            raise NotebookError("this run scores labels: give label= (one of its labels), not class_index=.")
        names = r.labels.names
        if label is None:
            k = _top(r)
        elif isinstance(label, str):
            if label not in names:
                raise NotebookError(f"label {label!r} is not one of this run's labels ({', '.join(names)}).")
            k = names.index(label)
        else:
            k = _index("label", label, len(names), f"this run has {len(names)} labels")
        target = Target.of_label(r.labels, k)
    else:
        if label is not None:
            raise NotebookError(
                f"label= is for zero-shot runs (vitviz.run(..., labels=...)); '{loaded.name}' "
                "explains classes: give class_index=."
            )
        if r.scores.numel() == 0:
            raise _no_scores(r, "class-specific relevance")
        n = r.scores.numel()
        k = _top(r) if class_index is None else _index("class_index", class_index, n, f"{loaded.name} has {n} classes")
        target = Target.of_class(k)
    if not r.has_graph:
        raise CaptureError(
            "Relevance needs the run's autograd graph, which was over the memory budget at this size: run at a "
            "smaller size=."
        )
    bound = r.bind(target)
    name = target.name(loaded.id2label)
    exp = explain_run(r, {k: (name, lambda out: bound(out).reshape(-1)[0])})[k]
    what = "score" if target.is_label else "logit"
    return figures.map_figure(
        r.capture.image,
        exp.patch_map(),
        title=f"Relevance for {name}'s {what} (Chefer et al. 2021)",
        colorbar_title="relevance (raw)",
        opacity=opacity,
    )


def _predictions(r: Run, *, top: Any = 5) -> go.Figure:
    from vitviz import figures

    if r.scores.numel() == 0:
        raise _no_scores(r, "predictions")
    top = _integer("top", top, 1, 1000, "how many classes or labels are drawn")
    if r.labels is None:
        from vitviz.capture.forward import predictions_from_logits

        return figures.predictions_figure(predictions_from_logits(r.scores.numpy(), r.loaded.id2label, top))
    from vitviz.models.zeroshot import from_logits, legend, rank

    scores = from_logits(r.scores.numpy(), r.loaded.text.rule)
    return figures.predictions_figure(rank(scores, r.labels.names)[:top], how=legend(scores.rule))


def _positions(cap: Capture, *, block: Any = 0) -> go.Figure:
    from vitviz import figures
    from vitviz.analysis.embeddings import position_similarity
    from vitviz.figures.views import SIMILARITY_SCALE, rgb_scale

    pos = cap.position
    if pos.tables:
        table = pos.tables[0]
        return figures.position_similarity_figure(position_similarity(table.embeddings), table.grid)
    if pos.biases:
        b = _index("block", block, len(pos.biases), f"{cap.model_name} has {len(pos.biases)} relative bias tables")
        bias = pos.biases[b].bias
        w = (bias.shape[-1] + 1) // 2
        lim = float(np.abs(bias).max()) or 1.0
        return figures.small_multiples_figure(
            bias,
            [f"head {h}" for h in range(bias.shape[0])],
            colorbar_title="bias added to the logit (raw)",
            cols=6,
            zmin=-lim,
            zmax=lim,
            colorscale=rgb_scale(SIMILARITY_SCALE),
        ).update_layout(
            title=f"{cap.model_name}, {pos.biases[b].name}: relative position bias, every head "
            f"({2 * w - 1} x {2 * w - 1} offsets in a {w} x {w} window; the centre is the query)"
        )
    why = cap.position_note or pos.note or "it encodes positions in a way vitviz does not draw"
    raise NotebookError(f"{cap.model_name} has no learned position embeddings or relative position biases: {why}.")
