"""The Features page's views: which SAE, a patch's strongest features, a feature's map and histogram, and edits.

The SAE is the bundled demo SAE (``vitviz/assets/demo-sae``, for the ``demo`` model), one of the operator's
(``saes`` in ``vitviz.toml``) or, outside public mode, a folder typed by the user (SAELens, ViT-Prisma or saev
layout). The feature card reads an index (``vitviz sae index``): the operator's (``sae_indexes``) or, outside
public mode, a typed file. Everything is computed by :mod:`vitviz.sae` on the
image's Run (one clean forward, shared with the other pages); an edit is one more forward from the edited point
on (``Run.edited``), in the server's queue.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import streamlit as st

from ui import common
from vitviz import figures
from vitviz.figures.features import edited_predictions_figure, feature_histogram_figure
from vitviz.text import md_plain, plotly_plain

__all__ = [
    "BUNDLED",
    "TYPED",
    "get_sae",
    "choose_sae",
    "run_of",
    "features_of",
    "draw_metrics",
    "draw_token_features",
    "draw_feature_map",
    "draw_histogram",
    "draw_edit",
    "choose_index",
    "draw_card",
    "draw_label_search",
    "ATTRIBUTION_EXACT",
    "attribution_of",
    "draw_attribution",
]

BUNDLED = "The bundled demo SAE"
LISTED = "One of this server's SAEs"
TYPED = "An SAE folder on this machine"
BUNDLED_INDEX = "The bundled demo index"
LISTED_INDEX = "One of this server's indexes"
TYPED_INDEX = "An index file on this machine"


@st.cache_resource(max_entries=8, show_spinner=False)
def get_sae(path: str, stamp: int, point: str | None):
    """The SAE at ``path`` (read-only, shared by every session; ``stamp`` the weights' mtime, so a rewritten folder
    is read again)."""
    from vitviz.sae import load_sae

    return load_sae(path, point=point)


def _stamp(path: Path) -> int:
    try:
        files = [path] if path.is_file() else sorted(path.iterdir())
        return max((f.stat().st_mtime_ns for f in files if f.is_file()), default=0)
    except OSError:
        return 0


def choose_sae(cur: common.Current, *, prefix: str = "sae", others=(), check: bool = True):
    """The SAE picked in the page's widgets (keys ``f"{prefix}_source"``, ``_listed``, ``_path``, ``_point``),
    loaded and, where ``check``, checked against the model; None (with the reason shown). The bundled demo SAE is
    offered where ``cur``'s model or one of ``others`` (more panes' models) is ``demo``."""
    from vitviz.sae.demo import DEMO_SAE_DIR
    from vitviz.sae.load import check_point
    from vitviz.sae.model import SAEError

    settings = common.serve_settings()
    public = settings.public
    options = [BUNDLED] if "demo" in (cur.model.name, *(m.name for m in others)) else []
    if settings.saes:
        options.append(LISTED)
    if not public:
        options.append(TYPED)
    if not options:
        st.info(
            "Public mode offers the bundled demo SAE, for the `demo` model (pick `demo` in the sidebar), and the SAEs "
            "this server's operator lists: it lists none. Typed SAE folders are off in public mode."
        )
        return None
    source = st.radio("SAE", options, horizontal=True, key=f"{prefix}_source")
    point = None
    if source == BUNDLED:
        path = DEMO_SAE_DIR
    elif source == LISTED:
        names = {_shown(p, settings.saes): p for p in settings.saes}
        pick = st.selectbox("This server's SAEs", list(names), key=f"{prefix}_listed")
        path = Path(names[pick]).expanduser()
    else:
        text = st.text_input(
            "SAE folder or file", key=f"{prefix}_path", placeholder="/path/to/sae (cfg.json + sae_weights.safetensors)"
        )
        point = st.text_input("Its point, if the checkpoint does not say (saev)", key=f"{prefix}_point") or None
        if not text:
            st.caption("SAELens folders, ViT-Prisma checkpoints (config.json + .pt) and saev checkpoints are read.")
            return None
        path = Path(text).expanduser()
    try:
        sae = get_sae(str(path), _stamp(Path(path)), point)
        if check:
            check_point(sae, cur.model)
    except SAEError as exc:
        st.error(_visitor_message(exc, path, settings))
        return None
    return sae


def _visitor_message(exc: Exception, path: Path, settings) -> str:
    """The message of ``exc``; in public mode with the server's folders of ``path`` replaced by its shown name."""
    text = str(exc)
    if not settings.public:
        return text
    shown = _shown(str(path), [*settings.saes, *settings.sae_indexes])
    for form in sorted({str(path), str(path.resolve()), str(path.parent), str(path.parent.resolve())}, key=len)[::-1]:
        text = text.replace(form, shown if form.endswith(path.name) else "…")
    return text


def _shown(path: str, listed) -> str:
    """A listed path as a visitor sees it: its last part (and the one before where two share a name), never the
    server's folders."""
    p = Path(path)
    short = p.name or str(p)
    if sum(Path(q).name == p.name for q in listed) > 1:
        short = f"{p.parent.name}/{p.name}"
    return short


def _scope_tokens(scope: str) -> str:
    """How a count of the tokens an SAE reads is named: "patch tokens" (scope ``patches``), else "tokens"."""
    return "patch tokens" if scope == "patches" else "tokens"


def sae_key(folder: Path | None) -> str:
    """What names the picked SAE in the index caches: its place, its files' mtime and the point typed."""
    stamp = _stamp(folder) if folder is not None else 0
    return f"{folder}|{stamp}|{st.session_state.get('sae_point') or ''}"


def sae_location() -> Path | None:
    """The folder or file of the SAE picked (for ``metrics.json``), or None."""
    from vitviz.sae.demo import DEMO_SAE_DIR

    ss = st.session_state
    source = ss.get("sae_source")
    if source == BUNDLED:
        return Path(DEMO_SAE_DIR)
    if source == LISTED and ss.get("sae_listed"):
        listed = common.serve_settings().saes
        found = [p for p in listed if _shown(p, listed) == ss.sae_listed]
        return Path(found[0]).expanduser() if found else None
    if source == TYPED and ss.get("sae_path") and not common.serve_settings().public:
        return Path(ss.sae_path).expanduser()
    return None


def run_of(cur: common.Current):
    """The image's Run (the engine's cache: the forward the other pages read), in the server's queue."""
    from vitviz.capture.run import get_run
    from vitviz.data.images import read_image

    image = read_image(cur.image_bytes, max_bytes=common.upload_limit()).image
    return common.in_queue(lambda: get_run(cur.model, image, size=cur.key[2]))


def features_of(cur: common.Current, sae):
    """The SAE's features of every token of the image (:func:`vitviz.sae.run.features`)."""
    from vitviz.sae.run import features

    return features(run_of(cur), sae)


def draw_metrics(sae, folder: Path | None) -> None:
    """What the SAE is, and its measures where ``metrics.json`` is beside it."""
    from vitviz.sae.measure import read_metrics

    st.caption(
        f"{sae.cfg.describe()}. Read from a {sae.cfg.source} checkpoint." + "".join(f" {n}." for n in sae.cfg.notes)
    )
    m = read_metrics(folder) if folder is not None and folder.is_dir() else None
    if not m:
        return
    splice = (
        f"; spliced in, top-1 agreement {m['splice_top1_agreement']:.1%}, mean KL {m['splice_mean_kl']:.2g} nats"
        if m.get("splice_top1_agreement") is not None
        else ""
    )
    st.caption(
        f"On {m['images']:,} held-out images ({m['tokens']:,} {_scope_tokens(m['scope'])}): explained variance "
        f"{m['explained_variance']:.3f}, L0 {m['l0']:.1f}, dead {m['dead_fraction']:.1%}, dense (active on more "
        f"than 10 % of tokens) {m['dense_fraction']:.1%}{splice}."
    )


def draw_token_features(feats, token: int, token_label: str, *, k: int = 10) -> list[tuple[int, float]]:
    """The token's strongest features as a table; returns them."""
    top = feats.token_top(token, k)
    freq = feats.frequency()
    if not top:
        st.info(f"No feature is active on {token_label}.")
        return top
    st.dataframe(
        {
            "feature": [i for i, _ in top],
            "activation": [round(v, 4) for _, v in top],
            "active on (this image's tokens)": [f"{freq[i]:.0%}" for i, _ in top],
        },
        hide_index=True,
        width="stretch",
    )
    return top


def draw_feature_map(cur: common.Current, feats, feature: int, marked: tuple[int, int] | None, *, key: str):
    """The feature's activation over the image, clickable: a click picks the patch."""
    fig = figures.map_figure(
        cur.cap.image,
        feats.map(feature),
        title=f"Feature {feature} at {feats.point}",
        colorbar_title="activation",
        num_prefix_tokens=feats.n_prefix,
        opacity=0.6,
        marked=marked,
        click_hint="click to list this patch's features",
    )
    common.chart(fig, key=key, on_select="rerun", selection_mode="points")
    common.downloads(
        f"sae_feature_{feature}", f"{key}_files", sae_feature_map=feats.map(feature), sae_feature=np.int32(feature)
    )


def draw_histogram(feats, feature: int) -> None:
    gh, gw = feats.grid
    patches = feats.values[feats.n_prefix : feats.n_prefix + gh * gw, feature].numpy()
    common.chart(feature_histogram_figure(patches, feature=feature, where="this image's patches"), key="sae_hist")
    st.caption("Over this image only; the feature card below reads a histogram over a data set from an index.")


def draw_edit(cur: common.Current, sae, feature: int, op: str, value: float) -> None:
    """The predictions of the run with the feature edited (error term kept) beside the clean ones."""
    from vitviz.errors import VitvizError
    from vitviz.sae.run import FeatureEdit, edited

    run = run_of(cur)
    if run.scores.numel() == 0:
        st.info("This model gives no scores to compare (a backbone, or a zero-shot model without labels).")
        return
    try:
        got = common.in_queue(lambda: edited(run, sae, [FeatureEdit(feature, op, value)]))
    except VitvizError as exc:
        st.error(str(exc))
        return
    clean = run.scores.double().softmax(-1).numpy()
    new = got.scores[0].double().softmax(-1).numpy()
    order = np.argsort(-clean)[:8]
    names = [cur.model.id2label.get(int(i), str(i)) if cur.model.id2label else str(i) for i in order]
    what = {"clamp": f"clamped to {value:g}", "scale": f"scaled by {value:g}", "zero": "zeroed"}[op]
    common.chart(
        edited_predictions_figure(names, clean[order], new[order], title=f"Feature {feature} {what}"),
        key="sae_edit",
    )
    scope = "its patch tokens" if sae.cfg.tokens == "patches" else "every token"
    st.caption(
        f"The feature is changed on {scope} at {sae.cfg.point} and decoded; the SAE's error (what it does not "
        "reconstruct) is kept, so an edit that changes nothing gives the clean run exactly. Probabilities: softmax "
        "of the logits. "
        + ("Only the blocks after the point ran again." if got.replayed else "The edited run is a whole forward.")
    )


# --- the feature card (an index over a data set) ------------------------------------------------------------------


@st.cache_resource(max_entries=8, show_spinner=False)
def _index(path: str, stamp: int, sae_key: str, model_name: str, _sae, _loaded):
    """The index at ``path`` checked against the SAE and model (shared by every session; ``stamp``: the file's
    mtime, so a rebuilt index is read again; ``sae_key`` names the SAE, whose object is not hashed)."""
    from vitviz.sae.index import load_index

    return load_index(path, _sae, _loaded)


@st.cache_resource(max_entries=32, show_spinner=False)
def _crops(path: str, stamp: int, sae_key: str, model_name: str, feature: int, _sae, _loaded, _ix):
    from vitviz.sae.card import example_crops

    return common.in_queue(lambda: example_crops(_sae, _loaded, _ix, feature))


def choose_index(cur: common.Current, sae, sae_key: str):
    """The feature index picked (the operator's, or outside public mode a typed file), loaded and checked against
    the SAE and the model; None (with the reason shown)."""
    from vitviz.sae.demo import DEMO_INDEX, DEMO_INDEX_COMMAND, DEMO_INDEX_DATA, DEMO_SAE_DIR
    from vitviz.sae.index import FeatureIndexError

    settings = common.serve_settings()
    bundled = sae_location() == Path(DEMO_SAE_DIR) and cur.model.name == "demo" and DEMO_INDEX.is_file()
    options = (
        ([BUNDLED_INDEX] if bundled else [])
        + ([LISTED_INDEX] if settings.sae_indexes else [])
        + ([] if settings.public else [TYPED_INDEX])
    )
    if not options:
        st.info(
            "This public server offers no feature index (its operator lists them as `sae_indexes` in vitviz.toml); "
            "typed paths are off in public mode."
        )
        return None
    source = st.radio("Index", options, horizontal=True, key="sae_index_source")
    if source == BUNDLED_INDEX:
        path = DEMO_INDEX
        st.caption(
            f"The demo SAE's features over {DEMO_INDEX_DATA['n']} shape images it was not trained on "
            f"(`{DEMO_INDEX_COMMAND}`), bundled with vitviz: `python -m vitviz sae index-demo` rebuilds it."
        )
    elif source == LISTED_INDEX:
        names = {_shown(p, settings.sae_indexes): p for p in settings.sae_indexes}
        pick = st.selectbox("This server's indexes", list(names), key="sae_index_listed")
        path = Path(names[pick]).expanduser()
    else:
        text = st.text_input(
            "Index file", key="sae_index_path", placeholder="/path/to/index.parquet (vitviz sae index --out)"
        )
        if not text:
            st.caption(
                "Build one with `vitviz sae index --sae DIR --model M --data FOLDER --out FILE.parquet`: every "
                "feature's top examples, frequency, mean activation and histogram over a data set."
            )
            return None
        path = Path(text).expanduser()
    try:
        with st.spinner("Reading the index…"):
            return _index(str(path), _stamp(path), sae_key, cur.model.name, sae, cur.model)
    except FeatureIndexError as exc:
        st.error(_visitor_message(exc, path, settings))
        return None


def draw_card(cur: common.Current, sae, index, feature: int, sae_key: str) -> None:
    """The feature card: what the index says of the feature, its top examples with its map, its histogram over
    the data set, and its direct effect on the read-out."""
    from vitviz.errors import VitvizError
    from vitviz.figures.features import feature_crops_figure, index_histogram_figure

    e = index.feature(feature)
    meta = index.meta
    public = common.serve_settings().public
    when = f"{e.mean_active:.3g}" if e.mean_active is not None else "never active"
    where = "" if public else f" of {meta['data']!s}"  # a public visitor never sees the server's folders
    st.caption(
        f"Over {meta['images']:,} images ({meta['tokens']:,} {_scope_tokens(meta['scope'])}){where}: active on "
        f"{e.frequency:.2%} of tokens; mean activation {e.mean_activation:.3g} (zeros included), {when} where "
        f"active; largest {e.max_activation:.3g}."
    )
    if e.examples:
        try:
            with st.spinner("Drawing the top examples…"):
                crops, notes = _crops(
                    index.path, _stamp(Path(index.path)), sae_key, cur.model.name, feature, sae, cur.model, index
                )
        except VitvizError as exc:
            st.error(str(exc))
            crops, notes = [], []
        if crops:
            common.chart(
                feature_crops_figure(
                    [c.image for c in crops],
                    [c.title for c in crops],
                    title=f"Feature {feature}: its {len(crops)} strongest tokens over the data set",
                ),
                key="sae_card_crops",
            )
            st.caption(
                "Each crop is the model's input around the token (outlined), the feature's activation over the "
                "image in orange (scaled to the feature's largest activation)."
            )
        if notes and public:
            st.caption(f"{len(notes)} of the examples' images could not be read and are left out.")
        for n in [] if public else notes[:5]:
            st.caption(f"Left out: {n}")
    else:
        st.info(f"Feature {feature} is never active on the index's images.")
    common.chart(
        index_histogram_figure(
            e.histogram, e.edges, feature=feature, frequency=e.frequency, tokens=int(meta["tokens"])
        ),
        key="sae_card_hist",
    )
    draw_effects(cur, sae, feature)


def draw_effects(cur: common.Current, sae, feature: int) -> None:
    """The feature's direct effect on the classes (or on the typed labels of a zero-shot model)."""
    from vitviz.figures.features import effects_figure
    from vitviz.sae.card import feature_effects, label_effects, readout_for, top_effects
    from vitviz.sae.model import SAEError

    try:
        readout = readout_for(cur.model, sae.cfg.point)
        eff = feature_effects(sae, readout, [feature])
    except SAEError as exc:
        st.info(f"No direct effect: {exc}.")
        return
    if readout.kind == "embedding":
        labels = cur.labels
        if labels is None:
            st.info("Type labels in the sidebar to see the feature's direct effect on each label's score.")
            return
        eff = label_effects(eff, common.get_label_embeddings(cur.model.name, labels.prompts))
        names, what = list(labels.names), "direct effect on the label's score (u . t / |t|)"
    else:
        names, what = list(readout.names), "direct effect on the logit"
    pos, neg = top_effects(eff[0], names, n=8)
    if not pos and not neg:
        st.info(f"Feature {feature}'s decoder direction has no direct effect on the read-out.")
        return
    common.chart(
        effects_figure(pos, neg, title=f"Feature {feature}: direct effect, most positive and negative", what=what),
        key="sae_card_effects",
    )
    st.caption(
        f"The feature's decoder direction through the final norm's weight (its scale at each image left out) and "
        f"the read-out ({readout.description}), on the direct path only: a stated approximation, comparable between "
        "classes, not a measured change. For a patch-token SAE read out from CLS, it is what the direction would do "
        "in the read-out's slot; the later blocks' paths are left out."
    )


def draw_label_search(cur: common.Current, sae) -> int | None:
    """Find features by typing a label (CLIP, SigLIP): features ranked by the cosine of their direct-effect
    direction with the label's text embedding. Returns a feature picked, or None."""
    from vitviz.figures.features import label_search_figure
    from vitviz.models.zeroshot import ZeroShotError, parse_labels
    from vitviz.sae.card import features_for_label, readout_for
    from vitviz.sae.model import SAEError

    text = st.text_input("Find features by a label", key="sae_label_search", placeholder="e.g. a dog")
    if not text.strip():
        return None
    try:
        readout = readout_for(cur.model, sae.cfg.point)
        template = cur.labels.template if cur.labels is not None else cur.model.text.template
        label = parse_labels(text, template)
        t = common.get_label_embeddings(cur.model.name, label.prompts[:1])[0]
        found = features_for_label(sae, readout, t, top=15)
    except (SAEError, ZeroShotError) as exc:
        st.info(str(exc))
        return None
    common.chart(
        label_search_figure([i for i, _ in found], [c for _, c in found], label=label.names[0]), key="sae_label_chart"
    )
    st.caption(
        f"Ranked by the cosine of each feature's direct-effect direction (decoder row through the final norm's "
        f'weight and {readout.description}) with the text embedding of "{label.prompts[0]}".'
    )
    pick = st.selectbox(
        "Show one of them", [i for i, _ in found], index=None, placeholder="a feature", key="sae_label_pick"
    )
    return None if pick is None else int(pick)


# --- attribution of the features to the explained target ------------------------------------------------------------

ATTRIBUTION_EXACT = 10  # features ablated exactly (one batched edited forward of this many copies)


def attribution_of(cur: common.Current, sae, sae_key: str, target, exact_top: int = ATTRIBUTION_EXACT):
    """:func:`vitviz.sae.run.attribution` of the image's Run (scoring the labels a label ``target`` reads) to
    ``target``; cached server-wide, computed in the queue."""
    from ui import cached
    from vitviz.capture.run import get_run
    from vitviz.capture.targets import label_set
    from vitviz.data.images import read_image
    from vitviz.sae.run import attribution

    def compute():
        image = read_image(cur.image_bytes, max_bytes=common.upload_limit()).image
        run = get_run(cur.model, image, size=cur.key[2], labels=label_set(target))  # the labels the target reads
        return attribution(run, sae, target, exact_top=exact_top)

    key = ("sae_attribution", *cur.key, sae_key, target, exact_top)  # a label Target holds its labels and prompts
    return cached.results_cache().get_or_compute(key, lambda: common.in_queue(compute))


def _ask_attribution(asked: tuple) -> None:
    st.session_state["sae_attr_asked"] = asked


def _attribution_asked(cur: common.Current, sae_key: str) -> bool:
    """Whether to attribute now: always locally; on a public server once the visitor asks for this image and SAE (a
    button), and from then on for every target they pick (the session remembers which image and SAE it was)."""
    if not common.serve_settings().public:
        return True
    asked = (cur.key, sae_key)
    if st.session_state.get("sae_attr_asked") == asked:
        return True
    # A callback, not the button's return value: it runs before the script, so a rerun cannot lose the click.
    if st.button("Attribute the features", key="sae_attr_go", on_click=_ask_attribution, args=(asked,)):
        return True
    st.caption(
        f"Ranks this image's features by their effect on the target above: one backward pass, then the top "
        f"{ATTRIBUTION_EXACT} features zeroed one at a time (batched edited forwards). On this shared server it runs "
        "when you ask."
    )
    return False


def draw_attribution(cur: common.Current, sae, sae_key: str) -> None:
    """The features ranked by their attribution to the explained target (the class or label, minus another, as on
    the other pages): the estimate (gradient x activation, one backward) for every feature, the exact effect of
    zeroing each of the top :data:`ATTRIBUTION_EXACT`, and the rank correlation of the two over those. A feature
    picked in the list becomes the page's ``sae_feature`` (its map, histogram and card)."""
    from ui import target_boxes
    from vitviz.errors import VitvizError
    from vitviz.figures.features import attribution_figure

    ranked = common.classes(cur)
    if ranked is None:
        st.info(
            "Attribution explains a class or label score: it needs a classifier, or labels for a zero-shot model "
            "(type them in the sidebar)."
        )
        return
    start = target_boxes.session_target(ranked)
    target_boxes.forget_widgets_unless(
        (cur.key, start, None if ranked.labels is None else ranked.labels.prompts),
        "sae_attr_target_index",
        "sae_attr_target_minus",
    )
    target = target_boxes.target_ui(ranked, key="sae_attr_target", start=start)
    if not _attribution_asked(cur, sae_key):
        return
    try:
        with st.spinner("Attributing the features (one backward, then the top ones zeroed)…"):
            att = attribution_of(cur, sae, sae_key, target)
    except VitvizError as exc:
        st.error(str(exc))
        return
    name = att.target.name(cur.model.id2label)
    ids = [int(i) for i in att.exact_ids]
    if not ids:
        st.info(f"No feature of this image has an estimated effect on {name}: every estimate is 0.")
        return
    n = len(ids)
    common.chart(
        attribution_figure(ids, att.estimate[ids], att.exact, target=plotly_plain(name)),
        key="sae_attr_chart",
    )
    st.dataframe(
        {
            "feature": ids,
            "estimate, one backward (gradient x activation)": [float(att.estimate[i]) for i in ids],
            "exact (zeroed)": [float(v) for v in att.exact],
        },
        hide_index=True,
        width="stretch",
        key="sae_attr_table",
    )
    rho = att.rank_correlation
    rho_text = "undefined (a side is constant)" if not np.isfinite(rho) else f"{rho:.3f}"
    st.caption(
        f"Target: {md_plain(name)} (clean value {att.clean:.4g}, before softmax). **Estimate, one backward**: "
        "for every feature i, the sum over the tokens in the SAE's scope of f_i(t) x d target / d f_i(t), gradient x "
        "activation through the decoder, a first-order guess of what removing the feature changes. **Exact**: the "
        f"target of the clean run minus the target with feature i zeroed (error term kept; one edited forward per "
        f"feature, batched), for the {n} features with the largest |estimate|, listed largest first. "
        f"Spearman rank correlation of the estimate and the exact values over these {n}: **{rho_text}**."
    )
    st.selectbox(
        "Show one of them on the map and card",
        ids,
        index=None,
        placeholder="a feature of this list",
        key="sae_attr_pick",
        on_change=_pick_attributed,
    )


def _pick_attributed() -> None:
    """A feature picked in the attribution list becomes the page's feature (before the page's boxes are drawn)."""
    ss = st.session_state
    if ss.get("sae_attr_pick") is not None:
        ss.sae_feature = int(ss.sae_attr_pick)
