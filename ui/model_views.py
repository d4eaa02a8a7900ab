"""Views of the model itself and of what it predicts, as functions of their state (as :mod:`ui.attention_views`).

A pane (``common.Current``) and frozen settings in, a drawn view out; no view reads session state, and ``key``
names what it draws (the pages pass their old keys, so widget keys and files stay as they were):

* ``draw_position_grid`` (cosine similarity of every learned position embedding to every other, the ViT
  paper's Figure 7): chart ``f"{key}_grid"`` (a click's customdata is ``[row, col]``);
* ``draw_position_tile`` (one position's similarity to all others, large): chart ``f"{key}_tile"``, downloads
  ``f"{files}-npz"``, ``f"{files}-csv"`` (``files`` defaults to ``key``);
* ``draw_bias`` (one block's relative position bias, every head): chart ``f"{key}_grid"``, downloads
  ``f"{key}-npz"``, ``f"{key}-csv"``;
* ``draw_components`` (principal components of the patch-embedding filters): chart ``key``, downloads
  ``f"{key}-npz"``, ``f"{key}-csv"``;
* ``draw_token_norms`` (every token's norm after every block of a stage, outliers named): chart ``key``,
  downloads ``f"{key}-npz"``, ``f"{key}-csv"``;
* ``draw_model_summary`` (what the model is and how it reads the image, in words): captions only;
* ``draw_patch_grid`` (the image the model saw, cut into its patches): chart ``key``;
* ``draw_token_sequence`` (the flattened input sequence, prefix tokens first): chart ``key``;
* ``draw_predictions`` (the top 5 classes or labels): chart ``key``;
* ``draw_target_relevance`` (Chefer et al.'s relevance for a class or label, or the difference of two, and
  for a zero-shot model its prompt words): chart ``key``, downloads ``f"{key}-npz"``, ``f"{key}-csv"``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import streamlit as st

from ui import cached, common, tiles
from vitviz import figures
from vitviz.analysis.embeddings import token_norm_outliers
from vitviz.capture.targets import Target
from vitviz.errors import VitvizError
from vitviz.models.load import LoadedModel
from vitviz.tables import long_table
from vitviz.text import md_plain, plotly_plain

__all__ = [
    "draw_prompt_words",
    "BiasSettings",
    "NormsSettings",
    "PositionSettings",
    "TargetRelevanceSettings",
    "draw_bias",
    "draw_components",
    "draw_position_grid",
    "draw_position_tile",
    "draw_model_summary",
    "draw_patch_grid",
    "draw_predictions",
    "draw_target_relevance",
    "explained",
    "draw_token_norms",
    "draw_token_sequence",
    "through",
]


@dataclass(frozen=True)
class PositionSettings:
    """A learned absolute position-embedding table of the model, and one of its positions (row-major)."""

    table: int = 0
    position: int = 0


@dataclass(frozen=True)
class BiasSettings:
    """One block's relative position bias (an index into ``model.position.biases``)."""

    block: int = 0


@dataclass(frozen=True)
class NormsSettings:
    """The stage whose token norms are shown."""

    stage: int = 0


@dataclass(frozen=True)
class TargetRelevanceSettings:
    """What relevance explains (a class or label, or the difference of two) and the blocks it runs through."""

    target: Target
    start_block: int = 0  # image relevance through blocks k..L-1
    text_start_block: int = 0  # zero-shot models: prompt-word relevance through text blocks k..


def position_similarity(cur: common.Current, s: PositionSettings) -> np.ndarray:
    """The (N, N) cosine similarities of table ``s.table``'s N position embeddings (cached per model)."""
    return cached.get_position_similarity(cur.cap.model_name, s.table)


def draw_position_grid(cur: common.Current, s: PositionSettings, *, key: str) -> np.ndarray:
    """Every position's similarity tile on the native grid (chart ``f"{key}_grid"``); returns the (N, N) table."""
    sim = position_similarity(cur, s)
    fig = figures.position_similarity_figure(sim, cur.model.position.tables[s.table].grid)
    common.chart(fig, key=f"{key}_grid", on_select="rerun", selection_mode="points")
    return sim


def draw_position_tile(cur: common.Current, s: PositionSettings, *, key: str, files: str | None = None) -> np.ndarray:
    """Position ``s.position``'s similarity to every position, large (chart ``f"{key}_tile"``), and the whole
    table's files (downloads ``f"{files}-npz"``, ``f"{files}-csv"``). Returns the tile ``(gh, gw)``."""
    sim = position_similarity(cur, s)
    g = cur.model.position.tables[s.table].grid
    r, c = divmod(s.position, g[1])
    tile = sim[s.position].reshape(g)
    common.chart(
        figures.map_figure(
            None,
            tile,
            patch_size=1,
            title=f"Similarity to position ({r}, {c})",
            colorbar_title="cosine similarity (raw)",
            zmin=-1,
            zmax=1,
            colorscale=figures.rgb_scale(figures.SIMILARITY_SCALE),
            marked=(r, c),
            height=420,
        ),
        key=f"{key}_tile",
    )
    common.downloads(
        "position_similarity",
        key if files is None else files,
        csv=long_table(sim, ("position (row-major)", "other position (row-major)"), "cosine similarity"),
        similarity=sim,
    )
    return tile


def draw_bias(cur: common.Current, s: BiasSettings, *, key: str) -> np.ndarray:
    """Every head's relative position bias of one block (chart ``f"{key}_grid"``, downloads ``f"{key}-npz"``,
    ``f"{key}-csv"``); returns the bias ``(H, 2w - 1, 2w - 1)``, the centre being the query itself."""
    bias = cur.model.position.biases[s.block].bias
    w = (bias.shape[-1] + 1) // 2
    lim = float(np.abs(bias).max()) or 1.0
    tiles.draw_tiles(
        bias,
        [f"{cur.model.position.biases[s.block].name}, head {h}" for h in range(bias.shape[0])],
        key=f"{key}_grid",
        colorbar_title="bias added to the logit (raw)",
        zmin=-lim,
        zmax=lim,
        colorscale=figures.rgb_scale(figures.SIMILARITY_SCALE),
    )
    st.caption(
        f"Each tile is {2 * w - 1} x {2 * w - 1}: the centre is the query itself, and the cell (dy, dx) from the "
        f"centre is what the head adds to the attention logit of a key dy rows below and dx columns right of the "
        f"query, inside a {w} x {w} window."
    )
    offsets = long_table(bias, ("head", "dy", "dx"), "bias added to the attention logit (raw)")
    offsets["dy"], offsets["dx"] = offsets["dy"] - (w - 1), offsets["dx"] - (w - 1)
    common.downloads(f"relative_bias_{s.block}", key, csv=offsets, bias=bias)
    return bias


def draw_components(cur: common.Current, *, key: str):
    """The patch-embedding filters' principal components (chart ``key``, downloads ``f"{key}-npz"``,
    ``f"{key}-csv"``), or why there are none; returns ``vitviz.analysis.embeddings.patch_components``'s
    result or None."""
    pcs = cached.get_patch_components(cur.cap.model_name)
    if pcs is None:
        st.info(f"{cur.cap.family} has no patch-embedding filters vitviz can show.")
        return None
    common.chart(figures.patch_components_figure(pcs.components, pcs.explained_variance_ratio), key=key)
    common.downloads(
        "patch_components",
        key,
        csv={
            **long_table(pcs.components, ("component", "row", "col", "channel"), "filter weight (unit-norm component)"),
            "explained variance of the component (fraction)": np.repeat(
                pcs.explained_variance_ratio, pcs.components[0].size
            ),
        },
        explained_variance_ratio=pcs.explained_variance_ratio,
        components=pcs.components,
    )
    return pcs


def draw_token_norms(cur: common.Current, s: NormsSettings, *, key: str) -> np.ndarray | None:
    """Stage ``s.stage``'s token norms after every block (chart ``key``), its high-norm tokens, and the files
    (downloads ``f"{key}-npz"``, ``f"{key}-csv"``); returns the norms ``(L + 1, T)`` or None (a message says why)."""
    cap = cur.cap
    stage = cap.stages[s.stage]
    if stage.token_norms is None:
        st.info(f"{cap.family} gives no token states vitviz can measure at this stage.")
        return None
    kinds = stage.prefix_kinds + ("patch",) * (stage.grid[0] * stage.grid[1])
    first = "embeddings" if s.stage == 0 else f"entering stage {s.stage}"
    # a row after each block with tokens of its own (a pooling head, as CCT's, has none)
    rows = [first, *(f"after {cap.block_label(b)}" for b in stage.blocks if cap.blocks[b].kind != "pool")]
    if len(rows) != len(stage.token_norms):  # a layout this naming does not know: rows by number, said plainly
        rows = [first, *(f"after the stage's block {r}" for r in range(len(stage.token_norms) - 1))]
    common.chart(figures.token_norms_figure(stage.token_norms, kinds, row_labels=rows), key=key)
    _, tokens = np.nonzero(token_norm_outliers(stage.token_norms))
    if len(tokens):
        listed = sorted({cap.token_label(int(t), s.stage) for t in tokens})
        st.warning(
            f"High-norm tokens (over 3x the block's median): {', '.join(listed[:12])}{' …' if len(listed) > 12 else ''}."
        )
    else:
        st.caption("No token's norm exceeds 3x its block's median.")
    norms = long_table(stage.token_norms, ("row", "token"), "token norm (L2)")
    common.downloads(
        "token_norms",
        key,
        csv={
            "row (0: the tokens entering; r: after the r-th block)": norms["row"],
            "residual stream": np.asarray(rows)[norms["row"]],
            "token": norms["token"],
            "token kind": np.asarray(kinds)[norms["token"]],
            "token norm (L2)": norms["token norm (L2)"],
        },
        token_norms=stage.token_norms,
    )
    return stage.token_norms


def draw_model_summary(cur: common.Current) -> None:
    """The model's name, family, blocks and heads (each stage's, for a hierarchical model), input size and the
    precision attention is stored in; a sentence when the model runs only at its configured size."""
    cap = cur.cap
    if cap.is_hierarchical:
        grids = "; ".join(
            f"stage {s.index}: {s.grid[0]} x {s.grid[1]} tokens (rows x columns){' + CLS' if s.num_prefix else ''}, "
            f"{len(s.blocks)} blocks of {cap.blocks[s.blocks[0]].num_heads} heads "
            f"({cap.blocks[s.blocks[0]].kind} attention)"
            for s in cap.stages
        )
        st.caption(
            f"**{cap.model_name}** ({cap.family}), input {cap.input_size[1]} x {cap.input_size[0]} px (width x height), "
            f"attention stored as {cap.attention_precision}. {grids}."
        )
    else:
        st.caption(
            f"**{cap.model_name}** ({cap.family}): {cap.num_layers} blocks x {cap.num_heads} heads, "
            f"input {cap.input_size[1]} x {cap.input_size[0]} px (width x height), {cap.num_tokens} tokens, "
            f"attention stored as {cap.attention_precision}."
        )
    if cur.model.family.fixed_size(cur.model.config) is not None:
        st.caption(f"{cap.family} runs only at its configured input size, so every image is resized to it.")


def draw_patch_grid(cur: common.Current, *, key: str) -> None:
    """The image as the model saw it (resized), its patch grid drawn over it (chart ``key``; hover names each
    patch's place in the sequence)."""
    cap = cur.cap
    fig = figures.image_figure(cap.image, patch_size=cap.patch_size, num_prefix_tokens=cap.num_prefix_tokens)
    common.chart(fig, key=key)


def draw_token_sequence(cur: common.Current, *, key: str) -> None:
    """The flattened input sequence of the first stage, prefix tokens first (chart ``key``), and how it is made."""
    cap = cur.cap
    common.chart(figures.token_sequence_figure(cap.token_kinds, cap.grid), key=key)
    made = cur.model.family.token_note(cur.model.config)  # a hybrid's CNN cells, Hiera's unrolled patches, ...
    st.caption(
        (
            made
            or "As in the ViT paper, the image is cut into patches, each flattened and linearly projected, "
            "and the sequence starts with the prefix tokens (CLS, and DeiT's DIST or DINOv2's registers)."
        )
        + (
            " Hierarchical models start from this first-stage grid and merge tokens between stages."
            if cap.is_hierarchical
            else ""
        )
    )


def draw_predictions(cur: common.Current, *, key: str) -> common.Classes | None:
    """The top 5 classes (or zero-shot labels) of the pane's image (chart ``key``); returns ``common.classes``'s
    ranking, or None (nothing drawn) for a model with nothing to rank."""
    ranked = common.classes(cur)
    if ranked is not None:
        common.chart(figures.predictions_figure(ranked.ranked[:5], how=ranked.legend), key=key)
    return ranked


def through(k: int, n: int, what: str = "blocks") -> str:
    """Which blocks relevance runs through when it starts at block ``k`` of ``n``."""
    if k == 0:
        return f"all {what} (the default)"
    return f"the last block ({k}) only" if k == n - 1 else f"{what} {k}-{n - 1}"


def image_blocks(cur: common.Current) -> int:
    """How many blocks image relevance can run through (a pooling head is not one)."""
    return sum(b.kind != "pool" for b in cur.cap.blocks)


def relevance_from_ui(cur: common.Current, container=st, label: str = "Relevance runs through") -> int:
    """The image blocks relevance runs through: the session's ``relevance_from`` (one value on every page),
    kept inside this model's blocks; returns the first block."""
    ss, n_enc = st.session_state, image_blocks(cur)
    if not 0 <= ss.relevance_from < n_enc:
        ss.relevance_from = 0
    container.selectbox(
        label,
        list(range(n_enc)),
        format_func=lambda k: through(k, n_enc),
        help="Default: all blocks, as MM-Explainability's start_layer=0. Its CLIP notebook uses the last "
        "block only; earlier blocks then count as identities.",
        **common.keep("relevance_from"),
    )
    return ss.relevance_from


def text_blocks(model: LoadedModel) -> int:
    """How many blocks the text tower of a zero-shot model has (0: none whose attention vitviz reads)."""
    from vitviz.models.text_hooks import install_text_hooks

    return install_text_hooks(model.model) if getattr(model, "zero_shot", False) else 0


def text_relevance_from(cur: common.Current) -> int:
    """The text blocks prompt-word relevance runs through: the session's ``text_relevance_from``, kept inside
    this model's text tower (0 where it has none)."""
    ss = st.session_state
    ss.setdefault("text_relevance_from", 0)
    if not 0 <= ss.text_relevance_from < max(text_blocks(cur.model), 1):
        ss.text_relevance_from = 0
    return ss.text_relevance_from


def text_relevance_from_ui(cur: common.Current, container=st) -> int:
    """:func:`text_relevance_from` with its box (drawn where the model has text blocks)."""
    first, n_text = text_relevance_from(cur), text_blocks(cur.model)
    if n_text:
        container.selectbox(
            "Prompt-word relevance runs through",
            list(range(n_text)),
            format_func=lambda k: through(k, n_text, "text blocks"),
            help="The text tower's blocks, on their own: default all of them (MM-Explainability's "
            "start_layer=0); its CLIP notebook's default is the last block only (start_layer_text=-1).",
            **common.keep("text_relevance_from"),
        )
    return first


def explained(target: Target, name: str) -> str:
    """What relevance explains, for a caption (markdown): "the logit (before softmax) of **cat (3)**", or
    "**cat (3) minus dog (5)**, the difference of the two logits (before softmax)"; ``name``: ``target.name(...)``."""
    if target.minus is None:
        score = "image-text score" if target.is_label else "logit (before softmax)"
        return f"the {score} of **{md_plain(name)}**"
    scores = "image-text scores" if target.is_label else "logits (before softmax)"
    return f"**{md_plain(name)}**, the difference of the two {scores}"


def draw_prompt_words(cur: common.Current, target: Target, start_block: int = 0) -> None:
    """Each explained label's prompt, its tokens coloured by their relevance for that label's score."""
    n_text = text_blocks(cur.model)
    for i in (target.index, target.minus):
        if i is None:
            continue
        label, prompt = target.labels[i], target.prompts[i]
        try:
            words = cached.get_prompt_relevance(
                *cur.key, cur.cap.image_embedding, label, prompt, start_block=start_block
            )
        except VitvizError as exc:
            st.error(str(exc))
            return
        st.markdown(figures.token_relevance_html(words.tokens, words.relevance), unsafe_allow_html=True)
        pooled = "its end-of-text token" if words.pooled is not None else "its last position (SigLIP pools padding)"
        st.caption(
            f"Prompt words for '{md_plain(label)}': relevance of each token (as the tokenizer cut it) for the score "
            f"of label '{md_plain(label)}', Chefer et al.'s rule on the text tower's attention from {pooled}, "
            f"through {through(words.start_block, n_text, 'text blocks')}; darker = more relevant "
            "(hover for the raw value)."
        )


def draw_target_relevance(cur: common.Current, s: TargetRelevanceSettings, *, key: str) -> np.ndarray | None:
    """Chefer et al.'s relevance of the pane's image for ``s.target`` through blocks ``s.start_block``.. (chart
    ``key``, downloads ``f"{key}-npz"``, ``f"{key}-csv"``) and, for a label, its prompt words through text blocks
    ``s.text_start_block``..; returns the map ``(gh, gw)`` or None (a message says why)."""
    cap, target = cur.cap, s.target
    name = target.name(cur.model.id2label)
    n_enc = image_blocks(cur)
    try:
        with st.spinner("Computing gradients for the relevance map…"):
            exp = cached.get_target_relevance(cur, target, s.start_block)
    except VitvizError as exc:
        st.error(str(exc))
        return None
    rel = exp.patch_map()
    common.chart(
        figures.map_figure(
            cap.image,
            rel,
            title=f"Relevance for {plotly_plain(name)} (Chefer et al. 2021)",
            colorbar_title="relevance (raw)",
        ),
        key=key,
    )
    st.caption(
        f"Explained: {explained(target, name)}. Chefer et al.'s rule, the {exp.readout} row of R, through "
        f"{through(exp.start_block, n_enc)}." + (f" {figures.flat_note(rel)}" if figures.is_flat(rel) else "")
    )
    common.downloads(
        "relevance_target",
        key,
        csv=long_table(rel, ("row", "col"), f"relevance for {name} (raw)"),
        relevance=rel,
    )
    if target.is_label:
        draw_prompt_words(cur, target, s.text_start_block)
    return rel
