"""Batch export of captures and analyses to ``.npz`` + a rollout overlay PNG per image."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from vitviz.analysis.blocks import global_query, head_maps
from vitviz.analysis.embeddings import position_similarity
from vitviz.analysis.rollout import capture_rollout
from vitviz.analysis.stats import summary_table
from vitviz.capture.forward import Capture, capture_batch, seen_part
from vitviz.capture.targets import Target, targets_arrays
from vitviz.causal import NotDefined, causal_arrays
from vitviz.cli_checks import unique_targets
from vitviz.data.images import load_image
from vitviz.errors import VitvizError
from vitviz.figures.animation import gif_bytes, gif_frames, view_stack
from vitviz.figures.overlay import fit_photo, overlay
from vitviz.models.load import LoadedModel
from vitviz.models.prompt_relevance import install_text_hooks, prompt_relevance, token_table
from vitviz.models.zeroshot import Labels, TextTower, ZeroShotError, score, text_embeddings

__all__ = ["block_query", "capture_arrays", "overlay_map", "ExportReport", "export_images", "sae_arrays"]


def block_query(cap: Capture, stage: int, query_xy: tuple[float, float] | None) -> int:
    """The query of ``export``: the token whose cell holds pixel ``query_xy`` (x, y) of the model input; without
    it, CLS where the stage has one, else the token at the input's centre."""
    if query_xy is not None:
        return cap.token_at(stage, *query_xy)
    s = cap.stages[stage]
    if "CLS" in s.prefix_kinds:
        return s.prefix_kinds.index("CLS")
    return cap.token_at(stage, cap.input_size[1] / 2, cap.input_size[0] / 2)


@dataclass(frozen=True)
class LabelScorer:
    """Zero-shot export: the labels as given and their text embeddings, computed once per run."""

    labels: Labels
    text: np.ndarray  # (K, D)
    model: object = field(repr=False)
    tower: TextTower = field(repr=False)
    start_block: int = 0  # prompt-word relevance through text blocks k..L-1 (0: all)

    @classmethod
    def build(cls, loaded: LoadedModel, labels: Labels, start_block: int = 0) -> LabelScorer:
        if not loaded.zero_shot:
            raise ZeroShotError(
                f"'{loaded.name}' has no text tower (or no tokenizer): --labels needs a CLIP- or SigLIP-style "
                "two-tower checkpoint. Drop --labels to export it as a backbone."
            )
        scorer = cls(labels, text_embeddings(loaded, labels.prompts), loaded.model, loaded.text, start_block)
        n = install_text_hooks(loaded.model)
        if n and not -n <= start_block < n:
            raise ZeroShotError(
                f"--relevance-from-block {start_block}: the text tower has {n} blocks, numbered 0..{n - 1} "
                "(or -1 for the last block)."
            )
        return scorer

    def arrays(self, cap: Capture) -> dict[str, np.ndarray]:
        scores = score(self.model, self.tower, cap.image_embedding, self.text)
        arrays = {
            "label_names": np.array(self.labels.names, dtype=str),
            "logits": scores.logits,
            "label_probabilities": scores.probabilities.astype(np.float32),
        }
        if install_text_hooks(self.model):  # a text tower whose attention vitviz reads (CLIP, SigLIP)
            words = prompt_relevance(
                self.model, self.tower, cap.image_embedding, self.labels, start_block=self.start_block
            )
            arrays["label_tokens"], arrays["label_token_relevance"] = token_table(words)
        return arrays


def capture_arrays(
    cap: Capture,
    *,
    pos_similarity: np.ndarray | None = None,
    query_xy: tuple[float, float] | None = None,
    labels: LabelScorer | None = None,
) -> dict[str, np.ndarray]:
    """The arrays written for one capture (no object arrays: loads with ``allow_pickle=False``).

    Every family: ``block_stage`` (B,), ``query_grids`` and ``key_grids`` (B, 2), and per
    block ``query_map_000``, ... (heads, kh, kw) float32: the query's raw attention over
    that block's keys on the key grid (see :func:`block_query`). ``rollout``: the
    readout rollout over all blocks, mean fusion, no discard, on the first stage's grid
    (CLS row, or the pooled query where there is no CLS), left out where rollout is
    undefined (``rollout_note`` says why). Summaries (B, H_max) are ``nan`` where a
    block has fewer heads. Plain one-grid ViTs also keep ``attentions`` (L, H, T, T).
    With ``labels`` (zero-shot models): ``label_names`` as given, ``logits`` the model's
    ``logits_per_image`` for their prompts in that order, ``label_probabilities`` by the
    model's own rule, ``label_tokens`` (K, T) each prompt's tokens as the tokenizer cut
    them ("" past its end) and ``label_token_relevance`` (K, T) float32 their relevance
    for that label's score (Chefer et al.'s text-side rule from the token the text tower
    pools, raw; NaN past the end; :mod:`vitviz.models.prompt_relevance`).
    """
    first = cap.stages[0]
    arrays = {
        "num_prefix_tokens": np.array(first.num_prefix),
        "token_kinds": np.array(cap.token_kinds),
        "grid": np.array(first.grid),
        "input_size": np.array(cap.input_size),
        "patch_size": np.array(cap.patch_size),
        "block_stage": np.array([b.stage for b in cap.blocks], dtype=np.int64),
        "mean_attention_distance": summary_table(cap.blocks, "distance"),
        "attention_entropy": summary_table(cap.blocks, "entropy"),
        "attention_entropy_normalised": summary_table(cap.blocks, "entropy_norm"),
        "logits": cap.logits if cap.logits is not None else np.zeros(0, np.float32),
        "top_k_indices": np.array([pr.index for pr in cap.predictions], dtype=np.int64),
        "top_k_labels": np.array([pr.label for pr in cap.predictions], dtype=str),
    }
    if first.token_norms is not None:
        arrays["token_norms"] = first.token_norms
    query_grids, key_grids = [], []
    for b, block in enumerate(cap.blocks):
        q = block_query(cap, block.stage, query_xy)
        maps = head_maps(block, q)
        arrays[f"query_map_{b:03d}"] = maps.values.astype(np.float32)
        query_grids.append(block.geometry.grid)
        key_grids.append(maps.grid)
    arrays["query_grids"] = np.array(query_grids, dtype=np.int64)
    arrays["key_grids"] = np.array(key_grids, dtype=np.int64)
    if cap.rollout_note:
        arrays["rollout_note"] = np.array(cap.rollout_note)
    else:
        row, _ = capture_rollout(cap)
        arrays["rollout"] = row[first.num_prefix :].reshape(first.grid)
    if cap.attention_stack is not None:
        arrays["attentions"] = cap.attention_stack.astype(np.float32)
    if labels is not None:
        arrays.update(labels.arrays(cap))
    if pos_similarity is not None:
        arrays["position_similarity"] = pos_similarity
    elif cap.position_embeddings is not None:
        arrays["position_similarity"] = position_similarity(cap.position_embeddings)
    return arrays


def overlay_map(cap: Capture, arrays: dict[str, np.ndarray]) -> tuple[str, np.ndarray]:
    """What the PNG beside each ``.npz`` shows: the rollout, or the last block's global map where rollout is undefined."""
    if "rollout" in arrays:
        return "rollout", arrays["rollout"]
    last = cap.blocks[-1]
    return "attention", head_maps(last, global_query(last)).values.mean(axis=0)


def _write_npz(path: Path, arrays: dict[str, np.ndarray]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as fh:  # an open file keeps numpy from appending ".npz" to the temp name
        np.savez(fh, **arrays)  # uncompressed: zlib on ~20 MB of float32 attention cost seconds per image
    os.replace(tmp, path)  # atomic: a crash never leaves half a file under the real name


@dataclass
class ExportReport:
    written: list[Path] = field(default_factory=list)
    failed: list[tuple[str, str]] = field(default_factory=list)  # (input, message)
    notes: dict[str, str] = field(default_factory=dict)  # key left out -> why (e.g. causal analyses a model lacks)
    renamed: list[tuple[str, str]] = field(default_factory=list)  # (input, file written) where stems collide


def export_images(
    loaded: LoadedModel,
    paths: Sequence[str | Path],
    out: str | Path,
    *,
    size: int | tuple[int, int] | None = None,
    batch_size: int = 8,
    query_xy: tuple[float, float] | None = None,
    labels: Labels | None = None,
    causal: bool = False,
    target: Target | None = None,
    methods: Sequence[str] | None = None,
    patch_from: str | Path | None = None,
    progress: Callable[[int], None] | None = None,
    gif: str | None = None,
    gif_head: int = 0,
    gif_side: int = 512,
    relevance_from_block: int = 0,
    sae=None,
    sae_features: Sequence[int] | None = None,
) -> ExportReport:
    """Write ``<stem>.npz`` and ``<stem>_rollout.png`` (``_attention.png`` where rollout is undefined) per image.

    The PNG is the map over the photo at the photo's own size, scaled down to at most
    2048 px on its long side (:func:`vitviz.figures.overlay.fit_photo`), bilinear, 60 %
    opacity, the map on its own min..max; for a model that sees a centre crop (a converted
    checkpoint, :func:`vitviz.capture.forward.seen_part`), over that crop of the photo.

    Unreadable images are reported in ``failed`` and skipped; everything written
    before a failure stays. ``progress(n)`` is called after each ``n`` images.
    ``causal``: also ``logit_lens``, ``head_ablation`` (zero knock-out effect on the
    explained ``target``: a :class:`~vitviz.capture.targets.Target`, else the top-1 class, or the top label of
    ``labels``), ``head_attribution``, ``mlp_attribution``, ``attribution_rest`` and ``explained_class``; keys a
    model does not support are left out and named in ``report.notes``. With ``causal`` also: the target explained
    (``target_kind``, ``target_index``, ``target_minus``, ``target_name``; zero-shot: ``target_label``), a
    difference target (``minus=``) making it ``logit[class] - logit[minus]`` (or label minus label), and
    ``logit_lens_patches`` (L + 1, gh, gw): the target through the final norm and head at each patch token.
    ``patch_from`` (with ``causal``): a source image whose activations are patched into each image's run
    (:func:`vitviz.causal.patching.activation_patching`): ``patching_class``, ``patching_residual`` (L, T),
    ``patching_heads`` (L, H), ``patching_clean_logit``, ``patching_source_logit``,
    ``patching_residual_estimate``, ``patching_heads_estimate``, ``patching_pattern`` (L, H: head h's attention
    pattern in block l from the source, :func:`vitviz.causal.paths.pattern_patching`) and ``patching_path`` (L, H:
    path patching from each head to the read-out, :func:`vitviz.causal.paths.path_patching`).
    ``gif``: also ``<stem>_<view>.gif``, the view stepping through the blocks
    (:func:`vitviz.figures.animation.view_stack`: ``head`` (``gif_head``), ``mean`` or
    ``rollout``; the query of ``query_xy`` where given), over the photo at most
    ``gif_side`` px on its long side, one colour scale for all frames; where the view is
    undefined the GIF is left out and the reason is in ``report.notes``.
    ``relevance_from_block``: prompt-word relevance through text blocks k..L-1 (0: all; -1: the last only).
    ``methods``: explanation methods (:mod:`vitviz.methods`, e.g. ``attnlrp``): ``method_<name>`` ``(gh, gw)``
    float32, each method's raw map on the first stage's grid for ``method_class`` (``target``'s class, without its
    ``minus``, else the top-1); a method that does not apply is refused before any image is read.
    ``sae`` (a :class:`~vitviz.sae.model.SparseAutoencoder` of one of the model's points): ``sae_point``, each
    token's strongest features ``sae_top_ids`` / ``sae_top_values`` (T, k) and the maps ``sae_feature_maps``
    (F, gh, gw) of ``sae_features`` (default: the image's most active features), ``sae_feature_ids`` (F,)
    (:func:`sae_arrays`); an SAE that does not fit the model is refused before any image is read.
    """
    chosen = _methods(loaded, methods)
    if sae is not None:
        from vitviz.sae.load import check_point

        check_point(sae, loaded)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    report = ExportReport()
    sim = position_similarity(loaded.position_embeddings) if loaded.position_embeddings is not None else None
    scorer = None if labels is None else LabelScorer.build(loaded, labels, relevance_from_block)  # before any image
    source = None if patch_from is None or not causal else load_image(patch_from)  # a bad source: before any image
    paths = list(paths)
    stems = unique_targets([Path(p).stem for p in paths])  # a/x.jpg, b/x.jpg -> x, x-1
    for start in range(0, len(paths), batch_size):
        chunk = paths[start : start + batch_size]
        images, names, chunk_stems = [], [], []
        for i, p in enumerate(chunk):
            try:
                images.append(load_image(p))
                names.append(Path(p))
                chunk_stems.append(stems[start + i])
            except VitvizError as exc:
                report.failed.append((str(p), str(exc)))
        if causal:  # each image's Run: the causal arrays read the same clean forward (one forward per image)
            images, names, chunk_stems, caps = _run_captures(loaded, images, names, chunk_stems, size, labels, report)
        else:
            try:
                caps = capture_batch(loaded, images, size=size)
            except VitvizError as exc:  # e.g. over the memory budget: every image of this batch failed
                report.failed.extend((str(p), str(exc)) for p in names)
                names, chunk_stems, caps = [], [], []
        for path, stem, cap in zip(names, chunk_stems, caps, strict=True):
            arrays = capture_arrays(cap, pos_similarity=sim, query_xy=query_xy, labels=scorer)
            if causal:
                image = images[names.index(path)]
                explained = _explained(loaded, image, size, labels, target)
                extra, why = causal_arrays(loaded, image, target=explained, size=size)
                arrays.update(extra)
                for key, reason in why.items():
                    report.notes.setdefault(key, reason)
                try:
                    arrays.update(_target_arrays(loaded, image, extra, explained, size, source))
                except VitvizError as exc:
                    report.failed.append((str(path), str(exc)))
                    continue
                for key, reason in arrays.pop("_notes", {}).items():
                    report.notes.setdefault(key, reason)
            if chosen:
                arrays.update(_method_arrays(loaded, images[names.index(path)], chosen, size, target))
            if sae is not None:
                try:
                    arrays.update(sae_arrays(loaded, images[names.index(path)], sae, sae_features, size))
                except VitvizError as exc:
                    report.failed.append((str(path), str(exc)))
                    continue
            npz = out / f"{stem}.npz"
            _write_npz(npz, arrays)
            name, grid_map = overlay_map(cap, arrays)
            # the photo's own size, at most 2048 px on its long side; the part the model saw (its crop, if any)
            seen = seen_part(loaded, images[names.index(path)], cap.input_size)
            photo = fit_photo(seen)
            overlay(photo, grid_map).save(out / f"{stem}_{name}.png")
            if gif is not None:
                _write_gif(
                    out / f"{stem}_{gif}.gif",
                    cap,
                    seen,
                    report,
                    gif,
                    gif_head,
                    gif_side,
                    None if query_xy is None else block_query(cap, 0, query_xy),
                )
            report.written.append(npz)
            if stem != path.stem:
                report.renamed.append((str(path), npz.name))
        if progress:
            progress(len(chunk))
    return report


def _run_captures(loaded: LoadedModel, images, names, stems, size, labels: Labels | None, report: ExportReport):
    """The capture of each image's :class:`~vitviz.capture.run.Run` (the one clean forward that the causal
    arrays, the per-patch lens and patching read too); images whose run fails are reported and left out."""
    from vitviz.capture.run import get_run
    from vitviz.capture.targets import NoScores

    kept: tuple[list, list, list, list] = ([], [], [], [])
    for image, name, stem in zip(images, names, stems, strict=True):
        try:
            try:
                cap = get_run(loaded, image, size=size, labels=labels).capture
            except NoScores:  # no scores to explain: the causal arrays say why; the capture needs none
                cap = get_run(loaded, image, size=size).capture
        except VitvizError as exc:  # e.g. over the memory budget
            report.failed.append((str(name), str(exc)))
            continue
        for got, value in zip(kept, (image, name, stem, cap), strict=True):
            got.append(value)
    return kept


def _methods(loaded: LoadedModel, methods: Sequence[str] | None) -> list:
    from vitviz.methods import MethodError, get_method

    chosen = [get_method(m) for m in methods or ()]
    for m in chosen:
        why = m.unavailable(loaded)
        if why:
            raise MethodError(why)
    return chosen


SAE_DEFAULT_MAPS = 8  # features mapped when none are chosen: the image's most active ones


def sae_arrays(loaded: LoadedModel, image, sae, feature_ids: Sequence[int] | None, size) -> dict[str, np.ndarray]:
    """``sae_point``; ``sae_top_ids`` (T, k) int32 and ``sae_top_values`` (T, k) float32, each token's k largest
    feature activations, largest first (k: a TopK SAE's own k, else 32; T the point's tokens); the maps
    ``sae_feature_maps`` (F, gh, gw) float32 of ``feature_ids`` over the point's patch grid (default: the
    :data:`SAE_DEFAULT_MAPS` features with the largest activation on any patch) and ``sae_feature_ids`` (F,)."""
    from vitviz.capture.run import get_run
    from vitviz.sae.run import features

    run = get_run(loaded, image, size=size)
    feats = features(run, sae)
    ids, vals = feats.top()
    if feature_ids is None:
        gh, gw = feats.grid
        peak = feats.values[feats.n_prefix : feats.n_prefix + gh * gw].max(dim=0).values.numpy()
        chosen = [int(i) for i in np.argsort(-peak, kind="stable")[:SAE_DEFAULT_MAPS] if peak[i] > 0]
    else:
        chosen = [int(i) for i in feature_ids]
    return {
        "sae_point": np.array(feats.point),
        "sae_top_ids": ids,
        "sae_top_values": vals,
        "sae_feature_ids": np.array(chosen, dtype=np.int32),
        "sae_feature_maps": feats.maps(chosen),
    }


def _explained(loaded: LoadedModel, image, size, labels: Labels | None, target: Target | None) -> Target | None:
    """The target ``export --causal`` explains: ``target``, else the top label of ``labels`` in the image's (cached)
    Run; None (the top-1 class) for a classifier."""
    if target is not None or labels is None:
        return target
    from vitviz.capture.run import get_run
    from vitviz.capture.targets import NoScores

    try:
        return get_run(loaded, image, size=size, labels=labels).target(None)
    except NoScores:  # the causal arrays say why there is nothing to explain
        return None


def _method_arrays(loaded: LoadedModel, image, chosen: list, size, target: Target | None) -> dict[str, np.ndarray]:
    """``method_<name>`` of each chosen method for ``target``'s class or label (its ``minus`` left out), else the
    top-1; ``method_class``."""
    from vitviz.methods import Inputs

    inputs = Inputs(loaded, image, size=size)
    if target is not None:
        target = Target(target.index, None, target.labels, target.prompts)
    else:
        c = inputs.predicted_class()
        target = None if c is None else Target.of_class(c)
    arrays = {f"method_{m.name}": m(inputs, target=target).values for m in chosen}
    if target is not None:
        arrays["method_class"] = np.int64(target.index)
    return arrays


_PATCHING_KEYS = (
    "patching_residual",
    "patching_heads",
    "patching_residual_estimate",
    "patching_heads_estimate",
    "patching_pattern",
    "patching_path",
)


def _target_arrays(loaded, image, causal: dict, target: Target | None, size, source) -> dict:
    """The target explained by ``causal_arrays`` (None: its ``explained_class``), the per-patch lens of it, and
    (with a source) patching.

    Keys a model lacks are named under ``"_notes"`` (key -> why), which the caller pops.
    """
    from vitviz.causal import activation_patching, patch_lens, patching_arrays, path_patching, pattern_patching

    if target is None:
        target = Target.of_class(int(causal["explained_class"]))
    arrays: dict = targets_arrays(target, loaded.id2label)
    notes: dict[str, str] = {}
    if not target.is_label:
        try:
            arrays["logit_lens_patches"] = patch_lens(loaded, image, target=target, size=size)
        except NotDefined as exc:
            notes["logit_lens_patches"] = str(exc)
    else:
        notes["logit_lens_patches"] = "The per-patch logit lens of zero-shot label scores is not defined."
    if source is not None:
        for key, grid in (("patching_pattern", pattern_patching), ("patching_path", path_patching)):
            try:  # attention-pattern and path patching, head by head: (L, H) float32 each. Pattern patching first:
                # its source forward keeps what the others read too, so the source costs one forward.
                arrays[key] = grid(loaded, image, source, target=target, size=size).values
            except NotDefined as exc:
                notes[key] = str(exc)
        try:
            p = activation_patching(loaded, image, source, target=target, size=size)
        except NotDefined as exc:
            notes.update(dict.fromkeys(("patching_class", *_PATCHING_KEYS), str(exc)))
        else:
            arrays.update(patching_arrays(p))
            for kind in ("residual", "heads"):
                if kind in p.notes:
                    notes[f"patching_{kind}"] = notes[f"patching_{kind}_estimate"] = p.notes[kind]
    arrays["_notes"] = notes
    return arrays


def _write_gif(
    path: Path, cap: Capture, photo, report: ExportReport, view: str, head: int, side: int, query: int | None
) -> None:
    try:
        maps, labels = view_stack(cap, view, head=head, query=query)
    except ValueError as exc:
        report.notes.setdefault(f"{view} GIF", str(exc))
        return
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(gif_bytes(gif_frames(photo, maps, labels, max_side=side)))
    os.replace(tmp, path)


def print_failures(report: ExportReport) -> None:
    from vitviz.cli_checks import terminal_text  # file names and messages quote input: control characters escaped

    for name, written in report.renamed:
        print(terminal_text(f"note: {name} written as {written} (another input has the same name)"), file=sys.stderr)
    for key, why in report.notes.items():
        print(terminal_text(f"note: {key} left out: {why}"), file=sys.stderr)
    for name, msg in report.failed:
        print(terminal_text(f"error: {name}: {msg}"), file=sys.stderr)
