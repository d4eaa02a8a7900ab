"""What the views read, computed once and cached for every session: rollout, position similarity, patch
components, knock-outs, head importance, attribution, the logit lens, relevance for a target, the explanation
methods' maps and their deletion / insertion curves.

Each getter keys one server-wide :class:`vitviz.cache.BoundedCache` (``results_cache``: bounded in entries and
bytes) by the session's model, image and size (``Current.key``) and what the view asked for, and runs the model in
the server's queue (``common.in_queue``). All computing happens in ``vitviz``; the session state, the model and
capture caches and the widgets stay in :mod:`ui.common`.
"""

from __future__ import annotations

import numpy as np
import streamlit as st

from ui import common
from vitviz.analysis.embeddings import patch_components, position_similarity
from vitviz.analysis.rollout import capture_rollout
from vitviz.cache import BoundedCache
from vitviz.capture import forward as vcapture
from vitviz.capture.gradients import explain_targets
from vitviz.capture.targets import Target
from vitviz.data.images import read_image
from vitviz.models.load import LoadedModel
from vitviz.models.zeroshot import Labels


@st.cache_resource(max_entries=128, show_spinner=False)
def get_rollout(
    model_name: str,
    image_digest: str,
    size: tuple[int, int] | None,
    _cap: vcapture.Capture,
    *,
    query: int | None,
    start: int,
    stop: int,
    fusion: str,
    discard: float,
) -> tuple[np.ndarray, int]:
    """Rollout row and the stage it lives on: fusing every block's heads is the costly part, so reruns reuse it."""
    return capture_rollout(_cap, query=query, start=start, stop=stop, fusion=fusion, discard_ratio=discard)


@st.cache_resource(max_entries=8, show_spinner=False)
def get_position_similarity(model_name: str, table: int = 0) -> np.ndarray | None:
    tables = common.get_model(model_name).position.tables
    return position_similarity(tables[table].embeddings) if table < len(tables) else None


@st.cache_resource(max_entries=4, show_spinner=False)
def get_patch_components(model_name: str):
    weights = common.get_model(model_name).patch_weights
    return None if weights is None else patch_components(weights, k=28)


@st.cache_resource(show_spinner=False)
def results_cache() -> BoundedCache:
    """Relevance maps, method maps and curves, server-wide; small, computed in the queue, never on a view change."""
    return BoundedCache(max_entries=256, max_bytes=256 * 2**20, size_of=common.nbytes_of)


def get_prompt_relevance(
    model_name: str,
    image_digest: str,
    size: tuple[int, int] | None,
    image_embedding: np.ndarray,
    label: str,
    prompt: str,
    start_block: int = 0,
):
    """Relevance of the prompt's tokens for one label's score on the session's image (text tower only)."""
    from vitviz.models.prompt_relevance import prompt_relevance

    def compute():
        loaded = common.get_model(model_name)
        one = Labels((label,), (prompt,), "{}")
        return common.in_queue(
            lambda: prompt_relevance(loaded.model, loaded.text, image_embedding, one, start_block=start_block)
        )[0]

    key = ("prompt_relevance", model_name, image_digest, size, prompt, start_block)
    return results_cache().get_or_compute(key, compute)


def target_of(cur: common.Current, index: int, minus: int | None = None) -> Target:
    """Class or label ``index`` (minus ``minus``) of the pane's model as the :class:`Target` the analyses take: a
    label of the pane's labels for a zero-shot model, else a class."""
    if cur.model.zero_shot and cur.labels is not None:
        return Target.of_label(cur.labels, index, minus)
    return Target.of_class(index, minus)


def scores_target(cur: common.Current) -> Target | None:
    """What a knock-out's scores are: the pane's labels' (a label target; zero-shot models), else class logits."""
    return target_of(cur, 0) if cur.model.zero_shot and cur.labels is not None else None


def get_knockout(cur: common.Current, heads: tuple[tuple[int, int], ...], mode: str):
    """``(Capture, Knockout)`` of the session's image with ``heads`` knocked out: one forward, cached, queued."""
    from vitviz.causal import capture_knocked_out

    def compute():
        image = read_image(cur.image_bytes, max_bytes=common.upload_limit()).image
        t = scores_target(cur)
        return common.in_queue(
            lambda: capture_knocked_out(cur.model, image, list(heads), mode=mode, size=cur.key[2], target=t)
        )

    return results_cache().get_or_compute(("knockout", *cur.key, heads, mode, scores_target(cur)), compute)


def get_importance(cur: common.Current, target: Target, mode: str, fast: bool, progress=None):
    """Head importance (exact, in batches) or the fast first-order estimate, for one target; cached, queued."""
    from vitviz.causal import fast_estimate, head_importance

    def compute():
        image = read_image(cur.image_bytes, max_bytes=common.upload_limit()).image
        kw = dict(target=target, mode=mode, size=cur.key[2])
        if fast:
            return common.in_queue(lambda: fast_estimate(cur.model, image, **kw))
        return common.in_queue(lambda: head_importance(cur.model, image, progress=progress, **kw))

    return results_cache().get_or_compute(("importance", *cur.key, target, mode, fast), compute)


def has_importance(cur: common.Current, target: Target, mode: str, fast: bool) -> bool:
    """Whether :func:`get_importance` of these settings is in the cache (computed before, not evicted)."""
    return ("importance", *cur.key, target, mode, fast) in results_cache()


def get_attribution(cur: common.Current, target: Target):
    """Direct logit attribution of ``target`` (a class, or the difference of two); cached, queued."""
    from vitviz.causal import direct_logit_attribution

    def compute():
        image = read_image(cur.image_bytes, max_bytes=common.upload_limit()).image
        return common.in_queue(lambda: direct_logit_attribution(cur.model, image, target=target, size=cur.key[2]))

    return results_cache().get_or_compute(("attribution", *cur.key, target), compute)


def get_lens(cur: common.Current):
    from vitviz.causal import logit_lens

    def compute():
        image = read_image(cur.image_bytes, max_bytes=common.upload_limit()).image
        return common.in_queue(lambda: logit_lens(cur.model, image, size=cur.key[2]))

    return results_cache().get_or_compute(("lens", *cur.key), compute)


def get_deformable(cur: common.Current) -> dict:
    """DAT: each deformable block's sampled points and attention over them, by block index (one forward)."""
    from vitviz.capture.deformable import deformable_samples

    def compute():
        image = read_image(cur.image_bytes, max_bytes=common.upload_limit()).image
        samples = common.in_queue(lambda: deformable_samples(cur.model, image, cur.cap.input_size))
        return {s.block: s for s in samples}

    return results_cache().get_or_compute(("deformable", *cur.key), compute)


@st.cache_resource(max_entries=16, show_spinner=False)
def get_causal_notes(model_name: str) -> dict[str, str]:
    """Which causal analyses a model supports ("" where defined, else why not); no forward pass."""
    from vitviz.causal import causal_notes

    return causal_notes(common.get_model(model_name))


@st.cache_resource(max_entries=16, show_spinner=False)
def get_knockable_blocks(model_name: str) -> tuple[int, ...]:
    from vitviz.causal import knockable_blocks

    return knockable_blocks(common.get_model(model_name))


def _methods(model: LoadedModel, attnlrp: str, target: Target) -> list[str] | None:
    """The methods the Compare page runs for ``target``: every available one (None), AttnLRP by the rules
    ``attnlrp`` names (``"attnlrp"``, the paper's; ``"attnlrp_cp"``, ``vitviz.methods.VARIANTS``)."""
    if attnlrp == "attnlrp":
        return None
    from vitviz.methods import available_methods

    return [attnlrp if m == "attnlrp" else m for m in available_methods(model, target)]


def target_scalar(cur: common.Current, target):
    """A :class:`~vitviz.capture.targets.Target` bound to the session's model: the forward's output -> a scalar
    (a class logit, a label's score, or the difference of two), as relevance backpropagates it."""
    emb = common.get_label_embeddings(cur.model.name, target.prompts) if target.is_label else None
    bound = target.bind(cur.model, emb)
    return lambda out: bound(out).reshape(-1)[0]


def get_target_relevance(cur: common.Current, target, start_block: int = 0):
    """Chefer et al.'s relevance of the session's image for ``target`` (a class or label, or the difference of
    two), through blocks ``start_block..L-1``: cached, queued."""

    def compute():
        image = read_image(cur.image_bytes, max_bytes=common.upload_limit()).image
        scalar = target_scalar(cur, target)
        name = target.name(cur.model.id2label)
        return common.in_queue(
            lambda: explain_targets(
                cur.model, image, {target.index: (name, scalar)}, size=cur.key[2], start_block=start_block
            )[target.index]
        )

    return results_cache().get_or_compute(("target_relevance", *cur.key, target, start_block), compute)


def get_target_maps(
    cur: common.Current, target: Target, labels: Labels | None = None, progress=None, attnlrp: str = "attnlrp"
) -> dict:
    """Every method's map for ``target`` (a class or label, or the difference of two; a label target holds its
    labels, ``labels`` is not read): cached, queued. ``progress(done, total, name)``: called before each method
    and at the end (see ``explain_many``); ``attnlrp``: AttnLRP's rules (``_methods``). Class-agnostic methods
    give the same map for every target."""
    from vitviz.methods import explain_many

    def compute():
        image = read_image(cur.image_bytes, max_bytes=common.upload_limit()).image
        methods = _methods(cur.model, attnlrp, target)
        return common.in_queue(
            lambda: explain_many(cur.model, image, methods, target=target, size=cur.key[2], progress=progress)
        )

    return results_cache().get_or_compute(("methods", *cur.key, target, attnlrp), compute)


def get_target_curves(
    cur: common.Current,
    target: Target,
    progress=None,
    labels: Labels | None = None,
    insertion_start: str = "mean",
    attnlrp: str = "attnlrp",
) -> list:
    """Deletion and insertion of every method's map for ``target``: cached, queued.

    The curves follow the target's probability (a label's by the model's rule); a difference A minus B: the
    probability of A minus that of B on the same perturbed images (the maps of A minus B order the patches), each
    area A's minus B's (the trapezoid rule is linear). ``insertion_start``: what insertion starts from
    (``vitviz.insertion_starts.INSERTION_STARTS``)."""
    from vitviz.capture.targets import label_set
    from vitviz.evaluate.faithfulness import Perturbations

    def compute():
        image = read_image(cur.image_bytes, max_bytes=common.upload_limit()).image
        maps = list(get_target_maps(cur, target, attnlrp=attnlrp).values())

        def run():
            perturb = Perturbations(
                cur.model,
                image,
                size=cur.key[2],
                batch_size=20,
                insertion_start=insertion_start,
                labels=label_set(target),
            )
            return perturb.curves_many(maps, target=target, progress=progress)

        return common.in_queue(run)

    return results_cache().get_or_compute(("curves", *cur.key, target, insertion_start, attnlrp), compute)
