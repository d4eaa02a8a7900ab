import threading
import time

import numpy as np
import pytest
from conftest import random_image

from vitviz.cache import BoundedCache
from vitviz.capture.forward import capture


def _cache(entries=3, nbytes=100):
    return BoundedCache(max_entries=entries, max_bytes=nbytes, size_of=len)


def test_entry_bound_and_lru_order():
    c = _cache()
    for k in "abc":
        c.get_or_compute(k, lambda k=k: k * 10)
    c.get_or_compute("a", lambda: pytest.fail("a is cached"))  # touch a: b is now the oldest
    c.get_or_compute("d", lambda: "d" * 10)
    assert len(c) == 3 and "b" not in c and "a" in c


def test_byte_bound():
    c = _cache(entries=10, nbytes=25)
    for k in "abc":
        c.get_or_compute(k, lambda: "x" * 10)
    assert c.nbytes <= 25 and len(c) == 2
    big = c.get_or_compute("huge", lambda: "y" * 26)
    assert big == "y" * 26 and "huge" not in c  # returned, never kept


def test_failures_are_not_cached():
    c = _cache()
    with pytest.raises(RuntimeError):
        c.get_or_compute("k", lambda: (_ for _ in ()).throw(RuntimeError("boom")))
    assert c.get_or_compute("k", lambda: "ok") == "ok"


def test_concurrent_requests_for_one_key_compute_once():
    c = _cache()
    calls = []

    def slow():
        calls.append(1)
        time.sleep(0.2)
        return "v"

    threads = [threading.Thread(target=c.get_or_compute, args=("k", slow)) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1


def test_fifty_analyses_stay_within_the_cache_limit(tiny_models):
    loaded = tiny_models["vit"]
    one = capture(loaded, random_image(0)).nbytes
    cache = BoundedCache(max_entries=32, max_bytes=5 * one, size_of=lambda cap: cap.nbytes)
    for seed in range(50):
        img = random_image(seed)
        cap = cache.get_or_compute(("vit", seed, None), lambda img=img: capture(loaded, img))
        assert cap.attentions.shape[0] == 2
        assert cache.nbytes <= 5 * one and len(cache) <= 5
    assert len(cache) == 5


def _rss() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * 4096


@pytest.mark.skipif(not __import__("os").path.exists("/proc/self/statm"), reason="needs /proc")
def test_process_memory_after_fifty_demo_analyses(demo_model):
    """50 different images through the app's cache settings: resident memory grows by at most 300 MB."""
    cache = BoundedCache(max_entries=32, max_bytes=1024 * 2**20, size_of=lambda cap: cap.nbytes)
    rng = np.random.default_rng(0)
    cache.get_or_compute("warm-up", lambda: capture(demo_model, random_image(999, (96, 96))))
    before = _rss()
    for i in range(50):
        img = random_image(int(rng.integers(1 << 30)), (120, 90))
        cache.get_or_compute(i, lambda img=img: capture(demo_model, img))
    grown = (_rss() - before) / 2**20
    print(f"RSS grew {grown:.1f} MB over 50 analyses; cache holds {len(cache)} records, {cache.nbytes / 2**20:.1f} MB")
    assert len(cache) == 32
    assert grown < 300


def test_failed_keys_leave_no_lock_behind():
    """Issue 23.16: a lock per failed key was kept forever (10,000 bad keys, 10,000 locks)."""
    c = _cache()
    for k in range(1000):
        with pytest.raises(RuntimeError):
            c.get_or_compute(k, lambda: (_ for _ in ()).throw(RuntimeError("boom")))
    assert c.pending == 0
    c.get_or_compute("ok", lambda: "v")
    assert c.pending == 0


def test_waiters_on_a_failing_key_compute_once_each_at_most_and_leave_no_lock():
    c = _cache()
    calls, started = [], threading.Event()

    def slow_fail():
        calls.append(1)
        started.set()
        time.sleep(0.1)
        raise RuntimeError("boom")

    errors = []

    def worker():
        try:
            c.get_or_compute("k", slow_fail)
        except RuntimeError:
            errors.append(1)

    first = threading.Thread(target=worker)
    first.start()
    started.wait()
    others = [threading.Thread(target=worker) for _ in range(4)]
    for t in others:
        t.start()
    first.join()
    for t in others:
        t.join()
    assert len(errors) == 5 and len(calls) == 5  # failures are not cached: each waiter tries in turn
    assert c.pending == 0


def test_evictions_are_reported_after_the_lock_and_an_oversize_value_can_be_kept_alone():
    seen: list[tuple[str, int]] = []
    cache: BoundedCache[int] = BoundedCache(
        max_entries=10,
        max_bytes=100,
        size_of=int,
        keep_oversize=True,
        on_evict=lambda k, v: seen.append((k, v, len(cache), k in cache)),  # reads the cache: no deadlock
    )
    for k, v in (("a", 40), ("b", 40), ("c", 30)):
        cache.put(k, v)
    assert seen == [("a", 40, 2, False)] and cache.sizes() == {"b": 40, "c": 30} and cache.nbytes == 70
    cache.make_room(35)  # before a value of 65 arrives: the least recent go first
    assert [s[0] for s in seen] == ["a", "b"] and cache.sizes() == {"c": 30}
    cache.put("big", 150)  # over the whole budget: kept alone
    assert cache.sizes() == {"big": 150} and cache.nbytes == 150 and seen[-1][0] == "c"
    assert cache.pop("big") == 150 and cache.pop("big") is None and cache.nbytes == 0
    assert len(seen) == 3  # pop is not an eviction
    plain: BoundedCache[int] = BoundedCache(max_entries=10, max_bytes=100, size_of=int)
    plain.put("big", 150)  # without keep_oversize: returned by get_or_compute, never kept
    assert len(plain) == 0 and plain.get_or_compute("big", lambda: 150) == 150 and len(plain) == 0
