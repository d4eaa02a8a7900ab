"""Data set: results of `python -m vitviz evaluate` over many images: areas per method, head distances, disagreements."""

import dataclasses
import hashlib
from pathlib import Path

import numpy as np
import streamlit as st

from ui import common
from ui.navigation import leave_folder_mode
from vitviz import figures
from vitviz.cache import BoundedCache
from vitviz.errors import VitvizError
from vitviz.evaluate.results import Results, Versus, read_results, versus_columns
from vitviz.insertion_starts import INSERTION_START_MEANINGS, INSERTION_START_NAMES
from vitviz.text import md_plain, plotly_plain

leave_folder_mode()
ss = st.session_state
if ss.pop("open_compare", False):
    st.switch_page("pages/compare.py")


def _open(
    path: str,
    model: str | None,
    class_index: int | None = None,
    labels: list[str] | None = None,
    template: str | None = None,
) -> None:
    """An "Open" click (a callback: it runs before the sidebar is drawn, so the sidebar shows the new model).

    The pages then explain the class the results file explained for that image (when its model is shown).
    A zero-shot run (``labels`` in its metadata) opens with its labels and template in the sidebar.
    """
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        ss.open_error = f"{path} cannot be opened: {exc}"
        return
    if model and model != ss.model_name and model in common.model_options():
        common.set_model(model)
        for key in ("model_pick", "model_text"):
            ss.pop(key, None)
    if labels:
        ss.labels_text, ss.template = "\n".join(labels), template or "{}"
    try:
        common.set_image(data, Path(path).name, class_index=class_index if model == ss.model_name else None)
    except VitvizError as exc:
        ss.open_error = f"{path} cannot be opened: {exc}"
        return
    ss.open_compare = True


if "open_error" in ss:
    st.error(ss.pop("open_error"))
st.header("A whole data set")
st.caption(
    "Results written by `python -m vitviz evaluate --model M --data FOLDER_OR_CSV --out RESULTS.parquet "
    "[--insertion-start blur|mean|grey|noise]`: per image and method the class explained, the deletion and "
    "insertion areas, and per image each head's mean attention distance. Insertion starts from the image's mean "
    "colour unless the run chose another start (blur keeps colour, so its curves are flat where colour is the "
    "evidence)."
)


@st.cache_resource(show_spinner=False)
def _results_files() -> BoundedCache:
    """Results files read, server-wide, bounded in bytes (``results_cache_mb``); read-only Arrow tables."""
    settings = common.serve_settings()
    return BoundedCache(
        max_entries=16, max_bytes=int(settings.results_cache_mb * 2**20), size_of=lambda r: r.table.nbytes
    )


def _read(data: bytes | str) -> Results:
    """A results file through the server's limits (checked from its footer) and its byte-bounded cache."""
    if isinstance(data, bytes):
        key = hashlib.sha256(data).hexdigest()
    else:  # the last local run: read again when the file changed
        key = ("path", data, Path(data).stat().st_mtime_ns if Path(data).is_file() else None)
    limits = common.serve_settings().results_limits
    return _results_files().get_or_compute(key, lambda: read_results(data, limits))


source = st.file_uploader("Results file (.parquet)", type=["parquet"], key="results_upload")
last = common.last_results_path()
if source is not None:
    if source.file_id != ss.get("results_seen"):  # a new file: counts as an upload (public mode limit)
        ss.results_seen = source.file_id
        try:
            common.session_limits().results_uploads.acquire()
        except VitvizError as exc:
            st.error(str(exc))
            st.stop()
        ss.results_source = source.getvalue()
elif last is not None:
    st.button(f"Open the last local run ({last.name})", on_click=lambda: ss.update(results_source=str(last)))
if ss.get("results_source") is None:
    st.info("Upload a results file" + (", or open the last local run." if last is not None else "."))
    st.stop()
try:
    results = _read(ss.results_source)
except VitvizError as exc:
    st.error(f"{exc} The previous results, if any, are no longer shown.")
    ss.results_source = None
    st.stop()

meta = results.meta
skipped = meta.get("skipped_total", len(meta.get("skipped", [])))  # the first 100 are listed; the total counts all
if results.table.num_rows == 0:
    st.info(
        f"This results file holds no results ({skipped:,} inputs skipped). Run `python -m vitviz evaluate` "
        "on images the model can read, then upload its results."
    )
    st.stop()
start = meta.get("insertion_start", "blur")
st.caption(  # every field comes from the file: plain text
    f"**{md_plain(meta.get('model'))}** on {results.num_images} images ({md_plain(meta.get('data', '?'))}), methods "
    f"{md_plain(', '.join(results.methods))}; seed {md_plain(meta.get('seed'))}; insertion from "
    f"{md_plain(INSERTION_START_NAMES.get(start, start))}; {skipped:,} inputs skipped."
    + (
        f" Zero-shot labels {md_plain(', '.join(repr(x) for x in meta['labels']))} (template "
        f"'{md_plain(meta.get('template'))}'): each image was explained for the label the model picked."
        if meta.get("labels")
        else ""
    )
)
summary = results.summary()
st.dataframe(
    [
        {
            "method": s.method,
            "images": s.n,
            "deletion area": f"{s.deletion_mean:.3f} ± {s.deletion_se:.3f}",
            "insertion area": f"{s.insertion_mean:.3f} ± {s.insertion_se:.3f}",
            "peak in box": "" if s.peak_in_box_rate is None else f"{s.peak_in_box_rate:.1%} of {s.n_boxes}",
        }
        for s in summary
    ],
    hide_index=True,
)
st.caption("Mean ± standard error over the images; the random map is the floor.")

st.subheader("Against random, image by image")
if "insertion_start" in meta:
    known = start in INSERTION_START_MEANINGS
    start_line = f"Insertion started from {md_plain(start)}" + (
        f": {INSERTION_START_MEANINGS[start]}." if known else " (not a start this vitviz knows)."
    )
else:  # the runs written before the choice existed started from blur
    start_line = (
        f"Insertion started from blur (files written before the choice existed): {INSERTION_START_MEANINGS['blur']}."
    )
st.caption(start_line)
versus = {area: results.versus("random", area) for area in ("insertion", "deletion")}
if "random" not in results.methods:
    st.info(
        "This file holds no random baseline to compare with. Run `python -m vitviz evaluate` again with it, e.g. "
        f"`--methods {md_plain(','.join(results.methods))},random` (without `--methods` every method that applies "
        "runs, random included)."
    )
elif not versus["insertion"]:
    st.caption("This run holds only the random baseline: there is no method to compare with it.")
else:
    direction = {"insertion": "higher", "deletion": "lower"}

    def _row(v: Versus) -> dict:
        """One method's comparison as text: Results.versus's numbers, rounded."""
        names = ("method", "images", f"{v.area} − random ({direction[v.area]}: better)", "better / tie / worse")
        if not v.n:  # the method and random share no image
            return dict(zip((*names, "sign test p"), (v.method, 0, "no image scored by both", "", ""), strict=True))
        se = f" ± {v.difference_se:.3f}" if np.isfinite(v.difference_se) else ""  # one image: no standard error
        shares = f"{100 * v.better_share:.0f} / {100 * v.tie_share:.0f} / {100 * v.worse_share:.0f} %"
        cells = (v.method, v.n, f"{v.difference_mean:+.3f}{se}", shares, f"{v.sign_p:.2g}")
        return dict(zip((*names, "sign test p"), cells, strict=True))

    for rows in versus.values():
        st.dataframe([_row(v) for v in rows], hide_index=True)
    tol = versus["insertion"][0].tolerance
    st.caption(
        "Each method's area minus random's on the same image, over the images both were scored on: the mean ± its "
        f"standard error (*by how much*). Better: the method's insertion area is higher than random's, or its deletion "
        f"area lower, by more than {tol:g}; within {tol:g} (a tenth of a percentage point) is a tie; worse: the "
        "other way by more. The exact two-sided sign test of the better against the worse images (ties left out; "
        "*how often*): the chance of a split at least this uneven if better and worse were equally likely."
    )
    both = versus["insertion"] + versus["deletion"]
    fields = {f.name: np.array([getattr(v, f.name) for v in both]) for f in dataclasses.fields(Versus)}
    common.downloads("versus_random", "versus", csv=versus_columns(both), **fields)  # NPZ: the Versus fields

deletion = {plotly_plain(m): results.method_rows(m).column("deletion_area").to_numpy() for m in results.methods}
insertion = {plotly_plain(m): results.method_rows(m).column("insertion_area").to_numpy() for m in results.methods}
common.chart(figures.areas_figure(deletion, insertion), key="areas")
curves = results.mean_curves()
any_method = next(iter(curves.values()))
common.chart(
    figures.curves_figure(
        any_method[0], {plotly_plain(m): (c[1], c[2]) for m, c in curves.items()}, target="the explained class"
    ),
    key="mean_curves",
)

st.subheader("Mean attention distance by depth, over the images")
dist = results.head_stats("distance")
if dist.size:
    image_px = max(max(results.images().column(c).to_pylist()) for c in ("input_height", "input_width"))
    with np.errstate(all="ignore"):
        mean, spread = np.nanmean(dist, axis=0), np.nanstd(dist, axis=0)
    common.chart(figures.distance_depth_figure(mean, image_px=image_px, spread=spread), key="distance_depth")
    st.caption(
        f"Each point: one head's mean over {dist.shape[0]} images; bars: the standard deviation over them "
        "(the ViT paper's Figure 7 right averaged 128 images)."
    )

st.subheader("Where the methods disagree most")
st.caption(
    "The ten images whose deletion areas differ most between the methods. Each row: every method's deletion area "
    "(the area under its deletion curve, the explained class's probability as patches go, 0 to 1; lower is better) "
    "and their range (the largest minus the smallest)."
)
methods = [m for m in results.methods if m != "random"]
ids = results.images().column("image_id").to_pylist()
paths = dict(zip(ids, results.images().column("path").to_pylist(), strict=True))
explained = dict(zip(ids, results.images().column("class_index").to_pylist(), strict=True))
areas = np.full((len(ids), len(methods)), np.nan)
index = {i: k for k, i in enumerate(ids)}
for j, m in enumerate(methods):
    t = results.method_rows(m)
    for image_id, a in zip(t.column("image_id").to_pylist(), t.column("deletion_area").to_pylist(), strict=True):
        areas[index[image_id], j] = a
if methods:
    scored = ~np.isnan(areas)  # an image some method did not score (or none did): the spread of those that did
    high = np.where(scored, areas, -np.inf).max(axis=1)
    low = np.where(scored, areas, np.inf).min(axis=1)
    spread = np.where(scored.any(axis=1), high - low, np.nan)
    order = np.argsort(-np.nan_to_num(spread, nan=-1))[:10]
else:  # a run of the random baseline alone: no methods to disagree
    spread = np.zeros(len(ids))
    order = np.arange(min(len(ids), 10))
    st.caption("This run holds only the random baseline: there is no disagreement between methods to rank by.")
public = common.serve_settings().public
for k in order:
    image_id = ids[k]
    cols = st.columns([3, 4, 1])
    cols[0].markdown(md_plain(image_id))
    cols[1].caption(
        "deletion area: "
        + ", ".join(f"{md_plain(m)} {areas[k, j]:.2f}" for j, m in enumerate(methods))
        + f"; range {spread[k]:.2f} (largest minus smallest)"
    )
    if not public:
        cols[2].button(
            "Open",
            key=f"open_{image_id}",
            on_click=_open,
            args=(paths[image_id], meta.get("model"), explained[image_id], meta.get("labels"), meta.get("template")),
            help="Show this image on the per-image pages (Compare explanations first)",
        )
if public:
    st.caption("On a public server, images named in a results file are not opened.")
