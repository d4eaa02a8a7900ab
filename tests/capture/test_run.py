"""The Run (vitviz.capture.run): one clean forward that Heads, Rollout, Relevance and Causal all read."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch
from conftest import Counter, random_image

from vitviz.capture import run as S
from vitviz.capture.forward import capture, input_size_for, preprocess
from vitviz.models.points import Edit

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(autouse=True)
def fresh_cache():
    S.clear_runs()
    yield
    S.clear_runs()


def _reference_relevance(loaded, img, c):
    """Relevance by its own forward with gradients (the path before the Run), as an independent reference."""
    from vitviz.analysis.relevance import relevance_abar, relevance_row
    from vitviz.capture.forward import build_stages, run_forward
    from vitviz.capture.gradients import GraphRecorder, _native_grad
    from vitviz.models.families.base import Call, to_native

    hw = input_size_for(loaded, None, img.size)
    pixels, _ = preprocess(loaded, [img], hw)
    pixels.requires_grad_(True)
    rec = GraphRecorder(loaded, Call(loaded.config, hw, 1))
    with torch.enable_grad():
        out = run_forward(loaded, pixels, rec)
        order = sorted(rec.raw)
        geoms = [rec.geometries[b] for b in order]
        attn = [to_native(geoms[i], rec.raw[b].detach(), 1)[0].float().numpy() for i, b in enumerate(order)]
        grads = torch.autograd.grad(out.logits[0, c], [rec.raw[b] for b in order])
    abars = {i: relevance_abar(geoms[i], attn[i], _native_grad(geoms[i], g, attn[i])) for i, g in enumerate(grads)}
    stages = build_stages(loaded, geoms, {}, 0)
    return relevance_row(geoms, stages, abars, readout=loaded.family.readout(loaded.config))


def test_heads_rollout_relevance_and_causal_share_one_forward(demo_model):
    from vitviz.analysis.rollout import capture_rollout
    from vitviz.capture.gradients import explain_classes
    from vitviz.causal import causal_arrays, fast_estimate
    from vitviz.data.shapes import make_sample

    loaded = demo_model
    img = make_sample(3).image
    with Counter(loaded.model) as count:
        run = S.get_run(loaded, img)
        cap = run.capture  # the Heads record
        row, _ = capture_rollout(cap)
        c = cap.predictions[0].index
        rel = explain_classes(loaded, img, [c])[c]
        arrays, why = causal_arrays(loaded, img)
        est = fast_estimate(loaded, img, mode="zero")
        again = S.get_run(loaded, img)
    assert count.n == 1 and again is run and run.has_graph
    assert why == {} and est.effects.shape == arrays["head_ablation"].shape

    from vitviz.methods import Inputs

    with Counter(loaded.model) as count:  # the explanation methods' inputs read the Run's capture too
        assert Inputs(loaded, img).capture is cap
    assert count.n == 0
    with Counter(loaded.model) as count:  # the references below run their own forwards
        ref = capture(loaded, img)
        ref_rel = _reference_relevance(loaded, img, c)
    assert count.n == 2
    np.testing.assert_array_equal(cap.attention_stack, ref.attention_stack)
    np.testing.assert_allclose(cap.logits, ref.logits, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(row, capture_rollout(ref)[0], rtol=1e-6)
    np.testing.assert_allclose(rel.relevance, ref_rel, rtol=1e-5, atol=1e-7)
    S.clear_runs()  # no Run cached (a data-set loop): relevance makes its own forward, no Run is kept
    with Counter(loaded.model) as count:
        alone = explain_classes(loaded, img, [c])[c]
    assert count.n == 1 and S.peek_run(loaded, img) is None
    np.testing.assert_allclose(alone.relevance, rel.relevance, rtol=1e-5, atol=1e-7)


def test_cache_is_keyed_and_bounded(tiny_models):
    loaded = tiny_models["vit"]
    a, b = random_image(1), random_image(2)
    run = S.get_run(loaded, a)
    assert S.get_run(loaded, a.copy()) is run  # same pixels, same run
    assert S.get_run(loaded, b) is not run
    assert S.get_run(loaded, a, size=48) is not run and S.get_run(loaded, a, size=48).input_size == (48, 48)
    for seed in range(3, 3 + S.CACHE_SIZE):
        S.get_run(loaded, random_image(seed))
    assert S.get_run(loaded, a) is not run  # evicted
    other = S.get_run(tiny_models["deit"], a)
    S.clear_runs(loaded.model)  # a server dropping a model drops its runs, and only those
    assert S.peek_run(loaded, a) is None and S.peek_run(tiny_models["deit"], a) is other


def test_runs_are_bounded_in_bytes_with_their_graphs_counted(tiny_models, monkeypatch):
    """A Run's size counts what its autograd graph saved; the cache keeps runs within a byte bound (a Run over the
    bound is returned and not kept), so wide uploads cannot fill the server's memory four at a time."""
    from vitviz.cache import BoundedCache

    loaded = tiny_models["vit"]
    with_graph = S.get_run(loaded, random_image(21))
    without = S.get_run(loaded, random_image(22), gradients=False)
    held = sum(t.untyped_storage().nbytes() for t in with_graph._raw.values())
    assert with_graph.has_graph and with_graph.graph_bytes > 0 and without.graph_bytes == 0
    assert with_graph.nbytes > without.nbytes + held // 2  # the graph's saved activations are counted
    assert with_graph.nbytes >= held + int(with_graph.capture.nbytes)
    small = BoundedCache(max_entries=10, max_bytes=int(with_graph.nbytes * 1.5), size_of=lambda r: r.nbytes)
    monkeypatch.setattr(S, "_RUNS", small)
    a = S.get_run(loaded, random_image(23))
    assert S.peek_run(loaded, random_image(23)) is a and small.nbytes == a.nbytes
    b = S.get_run(loaded, random_image(24))
    assert (
        S.peek_run(loaded, random_image(23)) is None and S.peek_run(loaded, random_image(24)) is b
    )  # bytes, not count
    monkeypatch.setattr(S, "_RUNS", BoundedCache(max_entries=10, max_bytes=1024, size_of=lambda r: r.nbytes))
    big = S.get_run(loaded, random_image(25))
    assert big.has_graph and S.peek_run(loaded, random_image(25)) is None  # returned, not kept


def test_concurrent_requests_for_one_image_make_one_forward(tiny_models):
    loaded = tiny_models["deit"]
    img = random_image(9)
    runs = []
    with Counter(loaded.model) as count:
        threads = [threading.Thread(target=lambda: runs.append(S.get_run(loaded, img))) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert count.n == 1 and len({id(r) for r in runs}) == 1


def test_edited_reuses_the_clean_prefix_and_equals_a_full_forward(tiny_models):
    loaded = tiny_models["vit"]
    img = random_image(4)
    run = S.get_run(loaded, img)
    edits = [Edit("blocks.1.attn.z", "zero", heads=(1,)), Edit("blocks.1.out", "mean", tokens=(2, 3))]
    with Counter(loaded.model) as count:
        fast = run.edited(edits)
    assert count.n == 0 and fast.replayed and fast.forward_equivalents == pytest.approx(0.5)
    full = run.edited(edits, reuse_prefix=False)
    assert not full.replayed and full.forward_equivalents == 1
    torch.testing.assert_close(fast.scores, full.scores, rtol=1e-5, atol=1e-6)
    assert not torch.allclose(fast.scores[0], run.scores)
    # "mean" is the clean run's token mean: a mean edit of every token equals replacing them by it
    x = run.activation("blocks.1.out")
    by_hand = run.edited([Edit("blocks.1.out", "replace", x[0].mean(0))])
    torch.testing.assert_close(run.edited([Edit("blocks.1.out", "mean")]).scores, by_hand.scores)


def test_patch_from_another_run(tiny_models):
    loaded = tiny_models["vit"]
    target, source = S.get_run(loaded, random_image(5)), S.get_run(loaded, random_image(6))
    got = target.edited([Edit("blocks.1.out", "patch", source)])  # the whole last residual: the source's logits
    torch.testing.assert_close(got.scores[0], source.scores, rtol=1e-5, atol=1e-6)
    got = target.edited([Edit("blocks.0.out", "patch", source, tokens=(0,))])  # CLS only, after block 0
    full = target.edited([Edit("blocks.0.out", "patch", source, tokens=(0,))], reuse_prefix=False)
    torch.testing.assert_close(got.scores, full.scores, rtol=1e-5, atol=1e-6)
    other = S.get_run(loaded, random_image(7), size=48)
    with pytest.raises(Exception, match="cannot patch"):
        target.edited([Edit("blocks.0.out", "patch", other)])


def test_backbone_runs_without_scores(tiny_models):
    run = S.get_run(tiny_models["dino"], random_image(8))
    assert run.scores.numel() == 0 and run.capture.logits is None
    pattern = run.activation("blocks.1.attn.pattern")  # the probabilities the forward used, raw layout
    assert run.has("blocks.1.attn.pattern") and pattern.shape == (1, 4, 17, 17)
    np.testing.assert_allclose(pattern[0].numpy(), run.capture.blocks[1].attention, atol=1e-3)  # float16 record
    assert run.activation("blocks.1.out").shape == (1, 17, 32)
    with pytest.raises(ValueError, match="no hook point"):
        run.activation("blocks.9.out")


@pytest.mark.parametrize("key", ["vit", "deit", "swin", "pvt", "mobilevit", "mobilevitv2"])
def test_run_summaries_wait_for_a_reader_and_equal_the_capture(tiny_dirs, hier_dirs, key):
    """A Run computes its per-head summaries when a view first reads them (the patching estimate reads none),
    from the float32 probabilities it keeps: the same values as a capture's, computed as each block ran."""
    from vitviz.models.load import load_model

    loaded = load_model(str({**tiny_dirs, **hier_dirs}[key]))
    img = random_image(4)
    run = S.get_run(loaded, img)
    blocks = run.capture.blocks
    assert not any(b.summaries.computed for b in blocks)
    before = run.capture.nbytes  # sizing computes nothing, and counts the weights the summaries wait on
    assert not any(b.summaries.computed for b in blocks)
    waiting = sum(run.probs(s.index).numel() * 4 for s in run.sites)  # float32 probabilities, one image
    assert sum(b.summaries.pending_bytes for b in blocks) == waiting
    reads = []
    threads = [threading.Thread(target=lambda: reads.append(blocks[0].entropy)) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len({id(r) for r in reads}) == 1 and blocks[0].summaries.computed  # computed once, shared
    assert blocks[0].summaries.pending_bytes == 0 and run.capture.nbytes < before
    ref = capture(loaded, img, attention_dtype="float32")  # eager: from the float32 weights as each block ran
    assert all(b.summaries.computed for b in ref.blocks)
    for got, want in zip(blocks, ref.blocks, strict=True):
        for name in ("distance", "entropy", "entropy_norm"):
            np.testing.assert_allclose(getattr(got, name), getattr(want, name), rtol=1e-6, atol=1e-9, equal_nan=True)
            assert not getattr(got, name).flags.writeable


def test_summaries_of_a_run_without_graph_read_outside_inference_mode(demo_model):
    """A Run made under a caller's inference mode (no graph) keeps inference tensors; its summaries, read later
    outside that mode, are still the capture's."""
    img = random_image(3, (96, 96))
    with torch.inference_mode():
        run = S.get_run(demo_model, img)
    assert not run.has_graph and not run.capture.blocks[1].summaries.computed
    ref = capture(demo_model, img, attention_dtype="float32")
    np.testing.assert_allclose(run.capture.blocks[1].entropy, ref.blocks[1].entropy, rtol=1e-6)
    np.testing.assert_allclose(run.capture.blocks[1].distance, ref.blocks[1].distance, rtol=1e-6)


def test_a_run_record_pickles_with_its_summaries(demo_model):
    """A copy of a record (pickle: another process, a notebook's file) carries the summaries' values, computed for
    the copy if no view had read them, not the function that waits on the Run's weights."""
    import pickle

    run = S.get_run(demo_model, random_image(5, (96, 96)))
    assert not run.capture.blocks[2].summaries.computed
    copy = pickle.loads(pickle.dumps(run.capture))
    assert all(b.summaries.computed and b.summaries.pending_bytes == 0 for b in copy.blocks)
    for got, want in zip(copy.blocks, run.capture.blocks, strict=True):
        np.testing.assert_array_equal(got.entropy, want.entropy)
        np.testing.assert_array_equal(got.distance, want.distance)


def test_a_zero_shot_models_label_runs_do_not_share_the_plain_models_run(modern_dirs):
    """A Run of labels (the two-tower model's scores of their prompts) must not be handed to the plain model (which
    has no scores without labels), nor to other labels: the labels are part of the Run's key."""
    from vitviz.models.load import load_model
    from vitviz.models.zeroshot import parse_labels

    loaded = load_model(str(modern_dirs["clip"]), device="cpu")
    img = random_image(31)
    assert S.get_run(loaded, img, labels=parse_labels("cat, dog, car")).scores.shape == (3,)
    assert S.get_run(loaded, img).scores.numel() == 0  # the plain model's own Run: no labels, no scores
    assert S.get_run(loaded, img, labels=parse_labels("cat, dog")).scores.shape == (2,)
