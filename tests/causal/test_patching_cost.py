"""Attribution patching's cost: the source image lends its values from one light forward (or its cached Run),
the target's clean Run is reused, and the numbers are those of the path that built two full Runs."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import Counter, random_image

from vitviz.capture import run as S
from vitviz.causal import patching as P

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(autouse=True)
def fresh_cache():
    S.clear_runs()
    yield
    S.clear_runs()


def _full_source_runs(monkeypatch):
    """The path before the light source: the source image got a full Run (attention, summaries, capture)."""

    def full(loaded, image, *, size, labels, budget_bytes, parts=()):
        return S.get_run(loaded, image, size=size, labels=labels, budget_bytes=budget_bytes, gradients=False)

    monkeypatch.setattr(P, "get_activations", full)


@pytest.mark.parametrize("key", ["vit", "deit", "beit"])
def test_the_light_source_gives_the_numbers_of_a_full_source_run(key, tiny_models, monkeypatch):
    loaded = tiny_models[key]
    img_t, img_s = random_image(21, (32, 32)), random_image(22, (36, 30))
    new = P.activation_patching(loaded, img_t, img_s, target=1, chunk=7)
    light = S.get_activations(loaded, img_s, size=(32, 32))  # the cached light forward
    assert isinstance(light, S.Activations)
    S.clear_runs()
    with monkeypatch.context() as m:
        _full_source_runs(m)
        old = P.activation_patching(loaded, img_t, img_s, target=1, chunk=7)
        source_run = S.peek_run(loaded, img_s, size=(32, 32))
    assert isinstance(source_run, S.Run)
    for a, b in (
        (new.residual, old.residual),
        (new.heads, old.heads),
        (new.residual_estimate, old.residual_estimate),
        (new.heads_estimate, old.heads_estimate),
    ):
        np.testing.assert_array_equal(a, b)  # the same forward: bit for bit
    assert new.source == old.source and new.clean == old.clean
    for s in source_run.sites:  # every value a patch reads equals the full Run's
        for part in ("attn.z", "out"):
            name = source_run.name(s.index, part)
            torch.testing.assert_close(light.activation(name), source_run.activation(name), rtol=0, atol=0)
        torch.testing.assert_close(light.block_tokens(s.index)[1], source_run.block_tokens(s.index)[1], rtol=0, atol=0)
    torch.testing.assert_close(light.scores, source_run.scores, rtol=0, atol=0)
    kept = {source_run.points.by_name[n].kind for n in light._values}
    assert kept == {"z", "out"}  # no attention, no residual inputs, no MLP outputs kept


def test_the_estimate_costs_one_forward_given_the_clean_run(tiny_models):
    """Given the page's clean Run: one forward (the source's, light) and one backward; nothing when the source's
    values are cached too (the exact grids after the estimate); with nothing cached: two forwards."""
    loaded = tiny_models["vit"]
    img_t, img_s = random_image(23, (32, 32)), random_image(24, (32, 32))
    with Counter(loaded.model) as count:
        run = S.get_run(loaded, img_t)
    assert count.n == 1 and run.has_graph
    with Counter(loaded.model) as count:
        est = P.activation_patching(loaded, img_t, img_s, target=0, exact=False)
    assert count.n == 1 and est.heads_estimate is not None
    with Counter(loaded.model) as count:  # the exact grid replays blocks, it runs no whole forward
        exact = P.activation_patching(loaded, img_t, img_s, target=0, estimate=False, residual=False)
    assert count.n == 0 and np.isfinite(exact.heads).all()
    assert S.peek_run(loaded, img_s) is None  # the source got no full Run
    S.clear_runs()
    with Counter(loaded.model) as count:
        again = P.activation_patching(loaded, img_t, img_s, target=0, exact=False)
    assert count.n == 2  # the target's Run (with its graph) and the source's light forward
    np.testing.assert_array_equal(again.heads_estimate, est.heads_estimate)
    S.clear_runs()
    S.get_run(loaded, img_s, gradients=False)  # the page showed the source: its Run lends the values
    S.get_run(loaded, img_t)
    with Counter(loaded.model) as count:
        P.activation_patching(loaded, img_t, img_s, target=0, exact=False)
    assert count.n == 0


def test_the_light_source_refuses_a_point_it_did_not_keep(tiny_models):
    from vitviz.errors import CaptureError

    loaded, img = tiny_models["vit"], random_image(25, (32, 32))
    light = S.get_activations(loaded, img)
    assert light.has("blocks.0.out") and not light.has("blocks.0.in")
    assert S.get_activations(loaded, img.copy()) is light  # cached by the pixels
    S.clear_runs(tiny_models["deit"].model)
    assert S.get_activations(loaded, img) is light  # another model's runs dropped only
    S.clear_runs(loaded.model)
    assert S.get_activations(loaded, img) is not light  # a server dropping the model drops its sources too
    with pytest.raises(CaptureError, match=r"did not keep the point blocks\.0\.in"):
        light.activation("blocks.0.in")


def test_another_source_for_the_same_target_needs_no_backward(tiny_models, monkeypatch):
    """The target's gradients are kept per (run, target): a second source image costs its light forward only, and
    gives the numbers a fresh backward gives; another target runs its own backward."""
    loaded = tiny_models["deit"]
    img_t = random_image(26, (32, 32))
    sources = [random_image(27, (32, 32)), random_image(28, (32, 32))]
    backward = []
    real = S.Run.gradients
    monkeypatch.setattr(S.Run, "gradients", lambda self, *a, **k: backward.append(1) or real(self, *a, **k))
    first = P.activation_patching(loaded, img_t, sources[0], target=2, exact=False)
    with Counter(loaded.model) as count:
        second = P.activation_patching(loaded, img_t, sources[1], target=2, exact=False)
    assert len(backward) == 1 and count.n == 1  # the second source's light forward, no backward
    assert first.forward_equivalents == pytest.approx(3.0) and second.forward_equivalents == pytest.approx(2.0)
    P.activation_patching(loaded, img_t, sources[1], target=0, exact=False)
    assert len(backward) == 2  # another target: its own backward
    S.clear_runs()
    P._GRADS.clear()
    fresh = P.activation_patching(loaded, img_t, sources[1], target=2, exact=False)
    assert len(backward) == 3
    np.testing.assert_array_equal(fresh.heads_estimate, second.heads_estimate)
    np.testing.assert_array_equal(fresh.residual_estimate, second.residual_estimate)
