"""The causal and comparison views as functions of their state (``ui/attention_views.py``'s pattern).

A pane (``common.Current``) and frozen settings in, a drawn view out; no view reads session state, and
``key`` prefixes every key it draws, so one page can draw the same view twice with two states:

* ``draw_method_maps`` (every method's map for a target, on one colour scale): chart ``f"{key}_maps"``;
* ``draw_curves`` (deletion and insertion of every method's map, their areas and files): chart ``key``,
  downloads ``f"{key}-npz"``, ``f"{key}-csv"``;
* ``draw_importance`` (the effect of knocking out each head, exact or estimated): chart ``f"{key}_map"``,
  downloads ``f"{key}-npz"``, ``f"{key}-csv"``;
* ``draw_attribution`` (each head's direct share of the logit): chart ``f"{key}_map"``, downloads as above;
* ``draw_patching`` (residual and head patching grids, a block's row over the image): slider ``f"{key}_block"``,
  charts ``f"{key}_residual_grid"``, ``f"{key}_row_map"``, ``f"{key}_heads_grid"``, downloads ``files_key``;
* ``draw_patch_lens`` (the per-patch logit lens): select slider ``f"{key}_lens_layer"``, chart ``f"{key}_lens_map"``.

Each has its computing half (``target_maps``, ``curves``, ``importance``, ``patching``, ``patch_lens``): cached
server-wide (``cached.results_cache``), computed in the queue, so a page may call it first with a progress
bar and the view then reads the cache. The session-only parts (the photo panel, the Compute and Stop buttons)
stay on the pages.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import streamlit as st

from ui import cached, common, tiles
from vitviz import figures
from vitviz.analysis.scales import SCALES, scale_maps
from vitviz.errors import VitvizError
from vitviz.figures.animation import lens_rows
from vitviz.figures.patching import patching_grid_figure
from vitviz.insertion_starts import DEFAULT_INSERTION_START, INSERTION_START_NAMES, INSERTION_STARTS
from vitviz.tables import long_table
from vitviz.text import plotly_plain

__all__ = [
    "STARTS",
    "AttributionSettings",
    "CurvesSettings",
    "ImportanceSettings",
    "MethodMapsSettings",
    "PatchingSettings",
    "class_name",
    "curves",
    "draw_attribution",
    "draw_curves",
    "draw_importance",
    "draw_method_maps",
    "draw_patch_lens",
    "draw_patching",
    "importance",
    "measured",
    "patch_lens",
    "patching",
    "target_maps",
]

# The insertion starts, the default first, as a sentence names them ("puts them back into ...").
STARTS = {s: INSERTION_START_NAMES[s] for s in sorted(INSERTION_STARTS, key=lambda s: s != DEFAULT_INSERTION_START)}


@dataclass(frozen=True)
class MethodMapsSettings:
    """Every method's map for ``target`` (``vitviz.capture.targets.Target``: a class or label, or A minus B)."""

    target: object
    scale: str = SCALES[0]  # vitviz.analysis.scales.SCALES
    attnlrp: str = "attnlrp"  # AttnLRP's rules: "attnlrp" (the paper's, the default) or "attnlrp_cp" (ATTNLRP)


@dataclass(frozen=True)
class CurvesSettings:
    """Deletion and insertion of every method's map for ``target``; insertion starts from ``start`` (``STARTS``)."""

    target: object
    start: str = "mean"
    attnlrp: str = "attnlrp"  # as MethodMapsSettings


@dataclass(frozen=True)
class ImportanceSettings:
    """Head importance for one class: every head knocked out alone (exact) or the first-order estimate (``fast``)."""

    class_index: int
    mode: str = "mean"  # what a knocked-out head's output becomes: "mean" or "zero"
    fast: bool = False
    marked: tuple[int, int] | None = None  # the (block, head) cell outlined


@dataclass(frozen=True)
class AttributionSettings:
    """Direct logit attribution of one class to every head."""

    class_index: int
    marked: tuple[int, int] | None = None


@dataclass(frozen=True)
class PatchingSettings:
    """Activation patching of the pane's image (the target run) with ``source`` (an image's bytes) for ``target``."""

    target: object
    source: bytes


def _labels(cur: common.Current):
    ranked = common.classes(cur)
    return None if ranked is None else ranked.labels


def class_name(cur: common.Current, index: int) -> str:
    """The class's (or zero-shot label's) name as ranked for the pane's image."""
    return next(p.label for p in common.classes(cur).ranked if p.index == index)


def measured(cur: common.Current, target) -> str:
    """What the curves follow: "probability of 'cat'" or "probability of 'cat' minus that of 'dog'"."""
    text = f"probability of '{class_name(cur, target.index)}'"
    return text if target.minus is None else f"{text} minus that of '{class_name(cur, target.minus)}'"


def _block_labels(cur: common.Current) -> tuple[list[str], list[int] | None]:
    cap = cur.cap
    stages = [b.stage for b in cap.blocks] if len(cap.stages) > 1 else None
    return [cap.block_label(b) for b in range(cap.num_blocks)], stages


# --- Compare ------------------------------------------------------------------------------------------


# AttnLRP's rules on the Compare page: the paper's (the default) or CP-LRP inside attention, as lxt explains ViTs
ATTNLRP = {
    "attnlrp": "the paper's rules (AttnLRP, the default)",
    "attnlrp_cp": "CP-LRP inside attention (lxt's ViT recipe)",
}


def target_maps(cur: common.Current, target, progress=None, attnlrp: str = "attnlrp") -> dict:
    """Every method's map for ``target`` by method name (``cached.get_target_maps``), cached; AttnLRP by the rules
    ``attnlrp`` names (:data:`ATTNLRP`)."""
    return cached.get_target_maps(cur, target, _labels(cur), progress=progress, attnlrp=attnlrp)


def draw_method_maps(cur: common.Current, s: MethodMapsSettings, *, key: str) -> dict:
    """Every method's map for ``s.target``, one tile each on ``s.scale`` (chart ``f"{key}_maps"``), each tile titled
    with its raw range. Returns the maps by method (``vitviz.methods`` results); raises what computing them raises."""
    maps = target_maps(cur, s.target, attnlrp=s.attnlrp)
    names = list(maps)
    scaled = scale_maps(np.stack([np.asarray(maps[m].values, np.float64) for m in names]), s.scale)
    tiles.draw_tiles(
        scaled.values,
        [f"{m} [{lo:.3g}, {hi:.3g}]" for m, (lo, hi) in zip(names, scaled.ranges, strict=True)],
        key=f"{key}_maps",
        colorbar_title=scaled.colorbar_title,
        image=cur.cap.image,
        tile_image=True,
        zmin=scaled.zmin,
        zmax=scaled.zmax,
        title=f"Every method's map for {plotly_plain(s.target.name(cur.model.id2label))}",
        cols=4,  # tiles wide enough for their titles ("integrated_gradients [-0.104, 2]") at 1366 x 768
        tile_px=200,
    )
    st.caption("Each tile's title gives the map's own range [min, max] before scaling.")
    flat = {m: maps[m].values for m in names if figures.is_flat(maps[m].values)}
    for m, values in flat.items():  # one rule for flat maps (vitviz.figures.flat), said on every page
        note = figures.flat_note(values, f"The {m} map")
        st.caption(
            note + (" The 'per map' scale stretches it anyway: its pattern is noise." if s.scale == "per map" else "")
        )
    return maps


def curves(cur: common.Current, s: CurvesSettings, progress=None) -> list:
    """Deletion and insertion results of every method (``cached.get_target_curves``), cached."""
    return cached.get_target_curves(
        cur, s.target, progress=progress, labels=_labels(cur), insertion_start=s.start, attnlrp=s.attnlrp
    )


def draw_curves(cur: common.Current, s: CurvesSettings, *, key: str) -> list:
    """The curves of every method (chart ``key``), the table of areas, the notes and the files (downloads
    ``f"{key}-npz"``, ``f"{key}-csv"``). Returns the results; raises what computing them raises."""
    results = curves(cur, s)
    what = measured(cur, s.target)
    target = s.target
    fig = figures.curves_figure(
        results[0].fractions,
        {r.method: (r.deletion, r.insertion) for r in results},
        target=plotly_plain(class_name(cur, target.index)),
    )
    fig.update_layout(title=f"Deletion and insertion curves: {plotly_plain(what)} (Petsiuk et al. 2018)")
    if target.minus is not None:  # a difference of two probabilities lies in [-1, 1]
        fig.update_yaxes(title_text=plotly_plain(what), range=[-1, 1], row=1, col=1)
        fig.update_yaxes(range=[-1, 1], row=1, col=2)
    common.chart(fig, key=key)
    rows = [
        {
            "method": r.method,
            "deletion area (lower is better)": round(r.deletion_area, 4),
            "insertion area (higher is better)": round(r.insertion_area, 4),
        }
        for r in sorted(results, key=lambda r: r.deletion_area)
    ]
    st.dataframe(rows, hide_index=True)
    floor = next((r for r in results if r.method == "random"), None)
    if floor is not None:
        beat = [r.method for r in results if r.method != "random" and r.deletion_area < floor.deletion_area]
        st.caption(f"Below the random floor on deletion ({floor.deletion_area:.3f}): {', '.join(beat) or 'none'}.")
    if np.ptp([r.insertion_area for r in results]) < 1e-3:
        st.caption(
            f"Every insertion area is the same here: {STARTS[s.start]} alone already gives the class "
            "its full probability, so insertion tells the methods apart on this image no better than chance."
        )
    common.downloads(
        "faithfulness",
        key,
        csv={
            "fraction of patches": results[0].fractions,
            **{f"{r.method} deletion ({what})": r.deletion for r in results},
            **{f"{r.method} insertion ({what})": r.insertion for r in results},
        },
        fractions=results[0].fractions,
        **{f"{r.method}_deletion": r.deletion for r in results},
        **{f"{r.method}_insertion": r.insertion for r in results},
    )
    return results


# --- Head importance ----------------------------------------------------------------------------------


def importance(cur: common.Current, s: ImportanceSettings, progress=None):
    """Head importance or its fast estimate (``cached.get_importance``), cached."""
    return cached.get_importance(cur, cached.target_of(cur, s.class_index), s.mode, s.fast, progress=progress)


def draw_importance(cur: common.Current, s: ImportanceSettings, *, key: str):
    """The block x head table of effects (chart ``f"{key}_map"``; a click's customdata is ``[block, head]``), the
    heads whose knock-out flips the top class (exact) and the files (downloads ``f"{key}-npz"``, ``f"{key}-csv"``).
    Returns the ``HeadImportance``; raises what computing it raises."""
    result = importance(cur, s)
    name = class_name(cur, s.class_index)
    labels, stages = _block_labels(cur)
    score = "image-text score" if _labels(cur) is not None else "logit"  # a zero-shot label's score is no logit
    title = "Fast estimate (first order, not exact)" if s.fast else "Effect of knocking out each head"
    fig = figures.layer_head_figure(
        result.effects,
        title=f"{title} on '{plotly_plain(name)}'<br>(click a cell to open that head)",
        colorbar_title=f"estimated change of the {score}" if s.fast else f"change of the {score}",
        marked=s.marked,
        row_labels=labels,
        stage_of_block=stages,
        diverging=True,
        value_name="estimate" if s.fast else "change",  # every estimated number says so, the hover included
    )
    common.chart(fig, key=f"{key}_map", on_select="rerun", selection_mode="points")
    if not s.fast:
        flips = np.argwhere(result.top1_changed)
        if len(flips):
            st.warning(
                "Knocking out any one of these heads changes the top class: "
                + ", ".join(f"{labels[b]} head {h}" for b, h in flips[:8])
            )
        else:
            st.caption("No single head's knock-out changes the top class of this image.")
        st.caption(f"Cost: {result.forward_equivalents:.0f} forward-equivalents of work.")
        common.downloads(
            "head_importance",
            key,
            csv=long_table(
                result.effects,
                ("block", "head"),
                f"change of the {score} of '{name}'" + (" (logits)" if score == "logit" else " (raw)"),
            ),
            effects=result.effects,
        )
    else:
        st.caption("First order: it can miss effects that need a large change (compare with the exact table).")
        common.downloads(
            "head_importance_estimate",
            key,
            csv=long_table(
                result.effects, ("block", "head"), f"estimated change of the {score} of '{name}' (first order)"
            ),
            estimated_effects=result.effects,
        )
    return result


def draw_attribution(cur: common.Current, s: AttributionSettings, *, key: str):
    """Each head's direct contribution to the class logit (chart ``f"{key}_map"``; a click's customdata is
    ``[block, head]``), the split of the logit and the files (downloads ``f"{key}-npz"``, ``f"{key}-csv"``).
    Returns the ``Attribution``, or None (a message says why)."""
    notes = cached.get_causal_notes(cur.cap.model_name)
    if notes["attribution"]:  # the note names the method itself ("Direct logit attribution is not defined ...")
        note = notes["attribution"]
        st.info(note if note.lower().startswith("direct logit attribution") else f"Direct logit attribution: {note}")
        return None
    if _labels(cur) is not None:
        st.info("Direct logit attribution splits class logits; for label scores it is not defined here.")
        return None
    try:
        with st.spinner("Splitting the logit into heads…"):
            attr = cached.get_attribution(cur, cached.target_of(cur, s.class_index))
    except (VitvizError, ValueError) as exc:
        st.error(str(exc))
        return None
    name = class_name(cur, s.class_index)
    labels, stages = _block_labels(cur)
    common.chart(
        figures.layer_head_figure(
            attr.heads,
            title=f"Direct contribution of each head to '{plotly_plain(name)}'",
            colorbar_title="direct contribution (logits)",
            marked=s.marked,
            row_labels=labels,
            stage_of_block=stages,
            diverging=True,
            value_name="contribution",
        ),
        key=f"{key}_map",
        on_select="rerun",
        selection_mode="points",
    )
    st.caption(
        f"The logit {attr.logit:.3f} = heads {np.nansum(attr.heads):.3f} + MLPs {attr.mlps.sum():.3f} + "
        f"embeddings and biases {attr.rest:.3f}, with the final norm's scale frozen at the image's value."
    )
    heads_table = long_table(attr.heads, ("block", "head"), "direct contribution (logits)")
    common.downloads(
        "head_attribution",
        key,
        csv={
            "block": np.concatenate([heads_table["block"], np.arange(len(attr.mlps))]),
            "part": [f"head {h}" for h in heads_table["head"]] + ["MLP"] * len(attr.mlps),
            f"direct contribution to the logit of '{name}' (logits)": np.concatenate(
                [heads_table["direct contribution (logits)"], attr.mlps]
            ),
        },
        heads=attr.heads,
        mlps=attr.mlps,
    )
    return attr


# --- Activation patching ------------------------------------------------------------------------------


def patching(cur: common.Current, s: PatchingSettings, exact: bool, progress=None):
    """The estimate (instant) or the exact grids of the pane's image patched with the source; cached, queued."""
    from vitviz.causal.patching import activation_patching
    from vitviz.data.images import read_image

    def compute():
        image = read_image(cur.image_bytes, max_bytes=common.upload_limit()).image
        source = read_image(s.source, max_bytes=common.upload_limit()).image

        def run(**bounds):
            return activation_patching(
                cur.model,
                image,
                source,
                target=s.target,
                size=cur.key[2],
                exact=exact,
                estimate=not exact,
                progress=progress,
                **bounds,
            )

        if not exact:  # one forward and one backward: one turn in the queue
            return common.in_queue(run)
        # The exact grids: batch by batch in the queue (others' forwards run between), within the work bound
        return run(max_work=common.patching_work_bound(), slot=common.batch_slot)

    key = ("patching", *cur.key, common.digest(s.source), s.target, exact)  # a label target holds its labels
    return cached.results_cache().get_or_compute(key, compute)


def draw_patching(cur: common.Current, s: PatchingSettings, *, key: str, exact: bool = False, files_key: str = ""):
    """The scores (metrics), the residual patching grid (chart ``f"{key}_residual_grid"``) and one block's row of
    it over the image (slider ``f"{key}_block"``, chart ``f"{key}_row_map"``), the head patching grid (chart
    ``f"{key}_heads_grid"``) and the files (downloads ``files_key`` or ``key``). ``exact``: the exact grids (else
    the estimate). Returns the ``Patching``; raises what computing it raises."""
    cap = cur.cap
    shown = patching(cur, s, exact)
    kind = "exact" if exact else "estimate"
    m1, m2, m3 = st.columns(3)
    m1.metric("Clean score (target)", f"{shown.clean:.4g}")
    m2.metric("Source score", f"{shown.source:.4g}")
    m3.metric("Work", f"{shown.forward_equivalents:.0f} forward-equivalents")
    for why in shown.notes.values():
        st.info(why)
    res = shown.residual if exact else shown.residual_estimate
    heads = shown.heads if exact else shown.heads_estimate
    blocks = [f"block {i}" for i in range(cap.num_blocks)]
    left, right = st.columns(2)
    if res is not None:
        change = res[:, shown.num_prefix :] - shown.clean  # (L, N): the patches' changes, block by block
        spread = np.nan_to_num(np.nanmax(np.abs(change), axis=1, initial=0.0))
        # the block drawn first: the one where patching a patch changes the score most (after the last block the
        # patch tokens reach no readout, so its row is flat)
        block = st.slider(
            "Block drawn on the image",
            0,
            res.shape[0] - 1,
            int(np.argmax(spread)),
            key=f"{key}_block",
            help="Opens on the block where patching one patch token changes the score most.",
        )
        with left:
            cols = [
                f"{k} {t}" if k != "patch" else f"p{t - shown.num_prefix} (token {t})"
                for t, k in enumerate(shown.token_kinds)
            ]
            common.chart(
                patching_grid_figure(
                    res,
                    clean=shown.clean,
                    source=shown.source,
                    title=f"Residual patching ({kind}): block x token",
                    x_title="token (prefix tokens first, then patches p0..)",
                    x_labels=cols,
                    row_labels=blocks,
                    marked_row=block,
                    scale_from=shown.num_prefix,
                ),
                key=f"{key}_residual_grid",
            )
            if shown.num_prefix:
                prefix = res[:, : shown.num_prefix] - shown.clean
                big = float(np.nanmax(np.abs(prefix))) if np.isfinite(prefix).any() else 0.0
                names = ", ".join(k for k in shown.token_kinds[: shown.num_prefix])
                st.caption(
                    f"The colour scale spans the patches' changes (up to {float(np.nanmax(spread)):.3g}). "
                    f"The {names} column{'s' if shown.num_prefix > 1 else ''} changes the score by up to {big:.3g}"
                    + (
                        ": beyond the scale, drawn in its end colours (hover for the values)."
                        if big > float(np.nanmax(spread))
                        else "."
                    )
                )
        with right:
            row = change[block].reshape(shown.grid)
            flat = figures.flat_note(row, "change from patching each patch token")
            span = float(np.nanmax(np.abs(row))) or 1.0
            common.chart(
                figures.map_figure(
                    cap.image,
                    row,
                    title=f"Block {block}: change from patching each patch token ({kind})",
                    colorbar_title="patched - clean",
                    colorscale=figures.SIMILARITY_SCALE,
                    zmin=-span,
                    zmax=span,
                    opacity=0.7,  # the image shows through
                ),
                key=f"{key}_row_map",
            )
            if flat:
                st.caption(flat)
    if heads is not None:
        common.chart(
            patching_grid_figure(
                heads,
                clean=shown.clean,
                source=shown.source,
                title=f"Head patching ({kind}): block x head",
                x_title="head",
                row_labels=blocks,
            ),
            key=f"{key}_heads_grid",
        )
    if res is None and heads is None:  # nothing was computed: no files (the notes above say why)
        return shown
    common.downloads(
        f"patching_{kind}",
        files_key or key,
        csv=_patching_table(shown, res, heads, kind, measured=target_word(cur)),
        **{k: v for k, v in (("residual", res), ("heads", heads)) if v is not None},
    )
    return shown


def target_word(cur: common.Current) -> str:
    """What the measured number is: a zero-shot label's image-text score, else a class logit."""
    return "image-text score" if _labels(cur) is not None else "logit"


def _patching_table(shown, res, heads, kind: str, *, measured: str) -> dict[str, np.ndarray]:
    """Both patching grids as one table, one row per cell: which grid, the block, the token (or head) index and its
    name, the patched score and its change from the clean one (every series the page plots)."""
    parts = []
    if res is not None:
        names = [k if k != "patch" else f"p{t - shown.num_prefix}" for t, k in enumerate(shown.token_kinds)]
        t = long_table(res, ("block", "token or head"), "value")
        parts.append(("residual (block x token)", t, np.asarray(names, dtype=object)[t["token or head"]]))
    if heads is not None:
        t = long_table(heads, ("block", "token or head"), "value")
        parts.append(("heads (block x head)", t, np.asarray([f"head {h}" for h in t["token or head"]], dtype=object)))
    unit = "logits" if measured == "logit" else "raw"
    suffix = ", first-order estimate" if kind == "estimate" else ""
    return {
        "grid": np.concatenate([[g] * len(t["value"]) for g, t, _ in parts]),
        "block": np.concatenate([t["block"] for _, t, _ in parts]),
        "token or head": np.concatenate([t["token or head"] for _, t, _ in parts]),
        "position": np.concatenate([n for _, _, n in parts]),
        f"patched score ({measured}, {unit}{suffix})": np.concatenate([t["value"] for _, t, _ in parts]),
        f"patched - clean ({unit}{suffix})": np.concatenate([t["value"] - shown.clean for _, t, _ in parts]),
    }


def head_paths(cur: common.Current, s: PatchingSettings, kind: str, progress=None):
    """Attention-pattern patching (``kind`` "pattern") or path patching to the read-out ("path") of the pane's image
    with the source, head by head; cached, run batch by batch in the queue, within the server's work bound."""
    from vitviz.causal import path_patching, pattern_patching
    from vitviz.data.images import read_image

    grid = pattern_patching if kind == "pattern" else path_patching

    def compute():
        image = read_image(cur.image_bytes, max_bytes=common.upload_limit()).image
        source = read_image(s.source, max_bytes=common.upload_limit()).image
        return grid(
            cur.model,
            image,
            source,
            target=s.target,
            size=cur.key[2],
            progress=progress,
            max_work=common.patching_work_bound(),
            slot=common.batch_slot,
        )

    key = (kind, *cur.key, common.digest(s.source), s.target)  # a label target holds its labels
    return cached.results_cache().get_or_compute(key, compute)


def draw_head_paths(cur: common.Current, s: PatchingSettings, kind: str, *, key: str):
    """The block x head grid of :func:`head_paths` (chart ``f"{key}_{kind}_grid"``) and its files."""
    shown = head_paths(cur, s, kind)
    what = "Attention-pattern patching" if kind == "pattern" else "Path patching to the read-out"
    blocks, _ = _block_labels(cur)
    common.chart(
        patching_grid_figure(
            shown.values,
            clean=shown.clean,
            source=shown.source,
            title=f"{what}: block x head",
            x_title="head",
            row_labels=blocks,
        ),
        key=f"{key}_{kind}_grid",
    )
    for note in shown.notes.values():
        st.info(note)
    st.caption(f"{shown.forward_equivalents:g} forward-equivalents (passes of the model over one image).")
    common.downloads(
        f"patching_{kind}",
        f"{key}_{kind}",
        csv=long_table(shown.values, ("block", "head"), f"{shown.target_name} after the patch (logit)"),
        **{kind: shown.values},
    )
    return shown


def patch_lens(cur: common.Current, target) -> np.ndarray:
    """The per-patch logit lens ``(L + 1, gh, gw)`` of the pane's image for ``target``; cached, queued."""
    from vitviz.causal import patch_lens as lens_of
    from vitviz.data.images import read_image

    def compute():
        image = read_image(cur.image_bytes, max_bytes=common.upload_limit()).image
        return common.in_queue(lambda: lens_of(cur.model, image, target=target, size=cur.key[2]))

    return cached.results_cache().get_or_compute(("patch_lens", *cur.key, target), compute)


def draw_patch_lens(cur: common.Current, target, *, key: str):
    """One residual stream's per-patch lens over the image (select slider ``f"{key}_lens_layer"``, chart
    ``f"{key}_lens_map"``). Returns ``(lens, layer, row names)``, or None where there is none (a note says why)."""
    try:
        lens = patch_lens(cur, target)
    except (VitvizError, ValueError) as exc:
        st.info(str(exc))
        return None
    rows = lens_rows(cur.cap)[0]  # row 0 the embeddings, row l after block l - 1 (0-based, as the other pages)
    defined = [r for r in range(lens.shape[0]) if np.isfinite(lens[r]).any()]  # a Swin: its last stage's rows
    if not defined:
        st.info("No residual stream of this model passes through its head token by token.")
        return None
    layer = (
        st.select_slider(
            "Residual stream",
            defined,
            defined[-1],
            format_func=rows.__getitem__,
            key=f"{key}_lens_layer",
        )
        if len(defined) > 1
        else defined[0]
    )
    common.chart(
        figures.map_figure(
            cur.cap.image,
            lens[layer],
            title=f"Per-patch lens, {rows[layer]}: {plotly_plain(target.name(cur.model.id2label))}",
            colorbar_title="score (raw)",
        ),
        key=f"{key}_lens_map",
    )
    return lens, layer, rows
