"""The model cache: bounded by bytes, LRU, reloads, one load per model, refusals, threads."""

from __future__ import annotations

import random
import threading
import time

import pytest
import torch

from vitviz.errors import ModelLoadError
from vitviz.serve.models import ModelCache, ModelTooLargeError, model_nbytes
from vitviz.serve.settings import ServeSettings


class Fake:
    """A "model": parameters of ``nbytes`` bytes in all."""

    def __init__(self, name: str, nbytes: int) -> None:
        self.name = name
        self._params = [torch.zeros(nbytes, dtype=torch.uint8)]

    def parameters(self):
        return iter(self._params)


class Stop(BaseException):
    """Stands for Streamlit's StopException (a BaseException): the visitor left."""


def loader(name: str, nbytes: int, calls: list | None = None, delay: float = 0.0):
    def load() -> Fake:
        if calls is not None:
            calls.append(name)
        if delay:
            time.sleep(delay)
        return Fake(name, nbytes)

    return load


def run_threads(targets) -> list[threading.Thread]:
    """Start a thread per target; an exception in one is kept on its thread and raised by :func:`join`."""

    def keeping(target):
        def run():
            try:
                target()
            except BaseException as exc:  # re-raised in the test's thread
                threading.current_thread().error = exc

        return run

    threads = [threading.Thread(target=keeping(t)) for t in targets]
    for t in threads:
        t.start()
    return threads


def join(threads) -> None:
    for t in threads:
        t.join(10)
        assert not t.is_alive()
    for t in threads:
        if getattr(t, "error", None) is not None:
            raise t.error


# -- sizes --------------------------------------------------------------------------------------


def test_nbytes_counts_parameters_and_buffers():
    lin = torch.nn.Linear(10, 4)  # 44 float32
    assert model_nbytes(lin) == 44 * 4
    bn = torch.nn.BatchNorm1d(8)  # 16 parameters, 8 + 8 + 1 (int64) buffers
    assert model_nbytes(bn) == 16 * 4 + 16 * 4 + 8
    half = torch.nn.Linear(10, 4).half()
    assert model_nbytes(half) == 44 * 2
    assert model_nbytes(Fake("x", 123)) == 123


def test_nbytes_of_a_loaded_model(tiny_dirs):
    from vitviz.models.load import load_model

    loaded = load_model(str(tiny_dirs["vit"]), device="cpu")
    expected = sum(p.numel() * p.element_size() for p in loaded.model.parameters())
    expected += sum(b.numel() * b.element_size() for b in loaded.model.buffers())
    assert model_nbytes(loaded) == model_nbytes(loaded.model) == expected > 0


def test_nbytes_refuses_what_it_cannot_size():
    with pytest.raises(TypeError):
        model_nbytes(object())


# -- LRU by bytes -------------------------------------------------------------------------------


def test_least_recently_used_is_dropped_first():
    cache = ModelCache(100)
    a = cache.get("a", loader("a", 40))
    cache.get("b", loader("b", 40))
    assert cache.get("a", loader("a", 40)) is a  # a hit: a becomes the most recent
    cache.get("c", loader("c", 40))
    assert cache.stats().names == ("a", "c") and cache.nbytes == 80
    assert cache.sizes() == {"a": 40, "c": 40}
    s = cache.stats()
    assert (s.hits, s.loads, s.evictions, s.reloads) == (1, 3, 1, 0)


def test_many_small_models_fit_where_a_count_would_not():
    cache = ModelCache(1000)
    for i in range(10):
        cache.get(i, loader(str(i), 100))
    assert len(cache) == 10 and cache.nbytes == 1000
    cache.get("big", loader("big", 500))
    assert len(cache) == 6 and cache.nbytes == 1000


def test_dropped_model_is_reloaded_transparently():
    cache = ModelCache(100)
    calls: list[str] = []
    progress: list[str] = []
    cache.get("a", loader("a", 60, calls), on_progress=progress.append)
    cache.get("b", loader("b", 60, calls), on_progress=progress.append)  # drops a
    assert "a" not in cache
    again = cache.get("a", loader("a", 60, calls), on_progress=progress.append)
    assert again.name == "a" and calls == ["a", "b", "a"]
    assert progress == ["Loading a…", "Loading b…", "Reloading a (it was unloaded to make room for other models)…"]
    assert cache.stats().reloads == 1


def test_known_size_makes_room_before_loading():
    cache = ModelCache(100)
    cache.get("a", loader("a", 60))
    seen = []

    def load_b():
        seen.append("a" in cache)
        return Fake("b", 60)

    cache.get("b", load_b, expected_bytes=60)
    assert seen == [False]  # a was dropped before b's weights came in: lower peak memory


def test_drop_and_clear():
    cache = ModelCache(100)
    cache.get("a", loader("a", 10))
    assert cache.drop("a") and not cache.drop("a") and cache.nbytes == 0
    cache.get("b", loader("b", 10))
    cache.clear()
    assert len(cache) == 0 and cache.nbytes == 0


# -- refusals -----------------------------------------------------------------------------------


TOO_BIG = (
    "'huge' needs {size} GiB of memory, more than the 1.00 GiB this server keeps for all its models. "
    "Choose a smaller model."
)


def test_known_oversize_is_refused_before_loading():
    cache = ModelCache(2**30)
    calls: list[str] = []
    with pytest.raises(ModelTooLargeError) as err:
        cache.get("huge", loader("huge", 10, calls), expected_bytes=3 * 2**30)
    assert str(err.value) == TOO_BIG.format(size="3.00")
    assert isinstance(err.value, ModelLoadError)
    assert calls == [] and cache.stats().refused == 1


def test_oversize_found_after_loading_is_dropped_and_remembered():
    cache = ModelCache(2**30, size_of=lambda m: int(1.5 * 2**30))
    calls: list[str] = []
    for _ in range(2):
        with pytest.raises(ModelTooLargeError) as err:
            cache.get("huge", loader("huge", 1, calls))
        assert str(err.value) == TOO_BIG.format(size="1.50")
    assert calls == ["huge"]  # the second request was refused before loading
    assert len(cache) == 0 and cache.nbytes == 0


def test_local_mode_keeps_an_oversize_model_alone():
    cache = ModelCache(100, refuse_oversize=False)
    cache.get("a", loader("a", 50))
    big = cache.get("big", loader("big", 300))
    assert big.name == "big" and cache.stats().names == ("big",) and cache.nbytes == 300
    cache.get("a", loader("a", 50))
    assert cache.stats().names == ("a",)


def test_from_settings():
    public = ModelCache.from_settings(ServeSettings(public=True, model_memory_gib=2.0))
    assert public.max_bytes == 2 * 2**30 and public.refuse_oversize and public._loading is not None
    local = ModelCache.from_settings(ServeSettings())
    assert local.max_bytes == 4 * 2**30 and not local.refuse_oversize and local._loading is None


# -- threads ------------------------------------------------------------------------------------


def test_concurrent_requests_load_once():
    cache = ModelCache(1000, poll_s=0.02)
    calls: list[str] = []
    results: list[Fake] = []
    waits: list[str] = []
    threads = run_threads(
        [lambda: results.append(cache.get("m", loader("m", 10, calls, delay=0.3), on_progress=waits.append))] * 8
    )
    join(threads)
    assert calls == ["m"] and len(results) == 8 and all(r is results[0] for r in results)
    assert "Waiting for m: another visitor is loading it…" in waits
    assert cache.stats().loads == 1


def test_a_failed_load_fails_its_waiters_once_then_retries():
    cache = ModelCache(1000, poll_s=0.02)
    calls: list[str] = []
    errors: list[Exception] = []

    def bad():
        calls.append("x")
        time.sleep(0.2)
        raise ModelLoadError("broken checkpoint")

    def ask():
        try:
            cache.get("x", bad)
        except ModelLoadError as exc:
            errors.append(exc)

    join(run_threads([ask] * 5))
    assert calls == ["x"] and len(errors) == 5 and {str(e) for e in errors} == {"broken checkpoint"}
    with pytest.raises(ModelLoadError):
        cache.get("x", bad)  # not cached: the next request tries again
    assert calls == ["x", "x"]


def test_when_the_loading_visitor_leaves_a_waiter_loads_it():
    cache = ModelCache(1000, poll_s=0.02)
    calls: list[str] = []
    started = threading.Event()
    outcome: dict[str, object] = {}

    def leaving_loader():
        calls.append("leaver")
        started.set()
        time.sleep(0.2)
        raise Stop()

    def leaver():
        try:
            cache.get("m", leaving_loader)
        except Stop:
            outcome["leaver"] = "stopped"

    def waiter():
        started.wait(5)
        outcome["waiter"] = cache.get("m", loader("m", 10, calls))

    join(run_threads([leaver, waiter]))
    assert outcome["leaver"] == "stopped" and outcome["waiter"].name == "m"
    assert calls == ["leaver", "m"] and "m" in cache


def test_a_waiter_that_leaves_stops_waiting_at_once():
    cache = ModelCache(1000, poll_s=0.02)
    started = threading.Event()
    outcome: dict[str, object] = {}

    def slow():
        started.set()
        time.sleep(0.6)
        return Fake("m", 10)

    def waiter_progress(message: str) -> None:
        raise Stop()

    def waiter():
        started.wait(5)
        t0 = time.monotonic()
        try:
            cache.get("m", slow, on_progress=waiter_progress)
        except Stop:
            outcome["waited"] = time.monotonic() - t0

    owner = run_threads([lambda: outcome.setdefault("owner", cache.get("m", slow))])
    join(run_threads([waiter]))
    assert outcome["waited"] < 0.3
    join(owner)
    assert outcome["owner"].name == "m" and "m" in cache


@pytest.mark.parametrize(("max_loading", "expected"), [(1, 1), (0, 3)])
def test_different_models_load_one_at_a_time_in_public_mode(max_loading, expected):
    cache = ModelCache(1000, max_loading=max_loading, poll_s=0.02)
    active, peak, lock = [0], [0], threading.Lock()
    waits: list[str] = []

    def load(name):
        def inner():
            with lock:
                active[0] += 1
                peak[0] = max(peak[0], active[0])
            time.sleep(0.2)
            with lock:
                active[0] -= 1
            return Fake(name, 10)

        return inner

    join(run_threads([lambda n=n: cache.get(n, load(n), on_progress=waits.append) for n in "abc"]))
    assert peak[0] == expected and len(cache) == 3
    assert ("Waiting for another model to finish loading…" in waits) == (max_loading == 1)


def test_the_budget_holds_under_concurrent_load():
    cache = ModelCache(1000, max_loading=2, poll_s=0.01)
    sizes = {f"m{i}": 50 + 37 * i for i in range(12)}
    rng = random.Random(0)
    plan = [[rng.choice(list(sizes)) for _ in range(30)] for _ in range(6)]
    violations: list[int] = []

    def visitor(names):
        for name in names:
            model = cache.get(name, loader(name, sizes[name]))
            lru = cache._models  # the invariant, read under the LRU's own lock
            with lru._lock:
                total, nbytes = sum(size for _, size in lru._data.values()), lru.nbytes
            if model.name != name or nbytes > cache.max_bytes or nbytes != total:
                violations.append(nbytes)

    join(run_threads([lambda p=p: visitor(p) for p in plan]))
    assert violations == []
    assert cache.nbytes <= 1000 and cache.stats().loading == ()


def test_real_tiny_models(tiny_dirs):
    from vitviz.models.load import load_model

    sizes = {k: model_nbytes(load_model(str(tiny_dirs[k]), device="cpu")) for k in ("vit", "deit")}
    cache = ModelCache(max(sizes.values()) + 1000)
    vit = cache.get("vit", lambda: load_model(str(tiny_dirs["vit"]), device="cpu"))
    assert cache.get("vit", lambda: pytest.fail("cached")) is vit
    cache.get("deit", lambda: load_model(str(tiny_dirs["deit"]), device="cpu"))
    assert cache.stats().names == ("deit",) and cache.nbytes == sizes["deit"]
    progress: list[str] = []
    again = cache.get("vit", lambda: load_model(str(tiny_dirs["vit"]), device="cpu"), on_progress=progress.append)
    assert again is not vit and again.family.name == vit.family.name
    assert progress == ["Reloading vit (it was unloaded to make room for other models)…"]


def test_an_evicted_model_is_handed_to_on_evict():
    """Whatever else holds an evicted model (the cached runs of vitviz.capture.run) can let it go."""
    from vitviz.serve.models import ModelCache

    gone: list[str] = []
    cache = ModelCache(10, size_of=lambda v: 6, on_evict=gone.append, max_loading=0)
    cache.get("a", lambda: "model a")
    cache.get("b", lambda: "model b")  # 12 bytes > 10: a goes
    assert gone == ["model a"]
    cache.drop("b")
    assert gone == ["model a", "model b"]
