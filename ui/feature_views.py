"""The Features page's views: which SAE, a patch's strongest features, a feature's map and histogram, and edits.

The SAE is the bundled demo SAE (``vitviz/assets/demo-sae``, for the ``demo`` model) or, outside public mode, a
folder typed by the user (SAELens, ViT-Prisma or saev layout). Everything is computed by :mod:`vitviz.sae` on the
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
]

BUNDLED = "The bundled demo SAE"
TYPED = "An SAE folder on this machine"


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


def choose_sae(cur: common.Current):
    """The SAE picked in the page's widgets, loaded and checked against the model; None (with the reason shown)."""
    from vitviz.sae.demo import DEMO_SAE_DIR
    from vitviz.sae.load import check_point
    from vitviz.sae.model import SAEError

    public = common.serve_settings().public
    options = [BUNDLED] if cur.model.name == "demo" else []
    if not public:
        options.append(TYPED)
    if not options:
        st.info(
            "Public mode offers the bundled demo SAE only, for the `demo` model: pick `demo` in the sidebar. Typed "
            "SAE folders are off in public mode."
        )
        return None
    source = st.radio("SAE", options, horizontal=True, key="sae_source")
    point = None
    if source == BUNDLED:
        path = DEMO_SAE_DIR
    else:
        text = st.text_input(
            "SAE folder or file", key="sae_path", placeholder="/path/to/sae (cfg.json + sae_weights.safetensors)"
        )
        point = st.text_input("Its point, if the checkpoint does not say (saev)", key="sae_point") or None
        if not text:
            st.caption("SAELens folders, ViT-Prisma checkpoints (config.json + .pt) and saev checkpoints are read.")
            return None
        path = Path(text).expanduser()
    try:
        sae = get_sae(str(path), _stamp(Path(path)), point)
        check_point(sae, cur.model)
    except SAEError as exc:
        st.error(str(exc))
        return None
    return sae


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
        f"On {m['images']} held-out images ({m['tokens']} {m['scope']} tokens): explained variance "
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
    st.caption(
        "Over this image only: a histogram over a data set needs an index of the SAE's features (not built yet)."
    )


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
