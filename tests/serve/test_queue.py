"""The forward-pass queue: K at once, FIFO, callbacks while waiting, leaving frees the place."""

from __future__ import annotations

import threading
import time

import pytest

from vitviz.serve.queue import ForwardQueue, QueueStats
from vitviz.serve.settings import ServeSettings


class Stop(BaseException):
    """Stands for Streamlit's StopException, raised from inside the on_wait callback."""


def wait_until(condition, timeout: float = 5.0) -> None:
    end = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.005)


def start(target) -> threading.Thread:
    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread


def join(*threads: threading.Thread) -> None:
    for t in threads:
        t.join(10)
        assert not t.is_alive()


def hold(queue: ForwardQueue, owner: str = "holder") -> tuple[threading.Event, threading.Thread]:
    """A thread that takes a slot and keeps it until the returned event is set."""
    release = threading.Event()

    def body():
        with queue.slot(owner):
            release.wait(10)

    thread = start(body)
    wait_until(lambda: queue.stats().running >= 1)
    return release, thread


@pytest.mark.parametrize("slots", [1, 2, 3])
def test_at_most_k_run_at_once(slots):
    queue = ForwardQueue(slots, poll_s=0.01)
    active, peak, lock = [0], [0], threading.Lock()

    def work():
        with queue.slot():
            with lock:
                active[0] += 1
                peak[0] = max(peak[0], active[0])
            time.sleep(0.05)
            with lock:
                active[0] -= 1

    join(*[start(work) for _ in range(8)])
    assert peak[0] == slots
    assert queue.stats() == QueueStats(slots=slots, running=0, waiting=0, served=8, left=0, longest_wait_s=0.0)


def test_no_limit_never_waits():
    queue = ForwardQueue(0, poll_s=0.01)
    inside = threading.Barrier(5, timeout=5)
    calls: list = []

    def work():
        with queue.slot(on_wait=lambda *a: calls.append(a)):
            inside.wait()  # all five are inside at once, or the barrier times out

    join(*[start(work) for _ in range(5)])
    assert calls == [] and queue.stats().served == 5


def test_first_in_first_out():
    queue = ForwardQueue(1, poll_s=0.01)
    release, holder = hold(queue)
    order: list[int] = []
    threads = []
    for i in range(6):

        def work(i=i):
            with queue.slot(f"s{i}"):
                order.append(i)

        threads.append(start(work))
        wait_until(lambda i=i: queue.stats().waiting == i + 1)  # joined in this order
    release.set()
    join(holder, *threads)
    assert order == list(range(6))


def test_first_in_first_out_with_two_slots():
    queue = ForwardQueue(2, poll_s=0.01)
    r1, h1 = hold(queue, "h1")
    r2, h2 = hold(queue, "h2")
    wait_until(lambda: queue.stats().running == 2)
    order: list[int] = []
    threads = []
    for i in range(5):

        def work(i=i):
            with queue.slot(f"s{i}"):
                order.append(i)
                time.sleep(0.02)

        threads.append(start(work))
        wait_until(lambda i=i: queue.stats().waiting == i + 1)
    r1.set()
    r2.set()
    join(h1, h2, *threads)
    assert order == list(range(5))


def test_waiters_are_told_their_place_and_elapsed_time():
    queue = ForwardQueue(1, poll_s=0.05)
    release, holder = hold(queue)
    seen: dict[str, list[tuple[int, float]]] = {"a": [], "b": []}
    release_a = threading.Event()

    def visitor(name, release_event=None):
        def body():
            with queue.slot(name, on_wait=lambda p, e: seen[name].append((p, e))):
                if release_event is not None:
                    release_event.wait(10)

        return body

    ta = start(visitor("a", release_a))
    wait_until(lambda: queue.stats().waiting == 1)
    tb = start(visitor("b"))
    wait_until(lambda: len(seen["b"]) >= 4)  # called periodically, not once
    assert queue.place("a") == 1 and queue.place("b") == 2 and queue.place("nobody") is None
    assert {p for p, _ in seen["b"]} == {2} and seen["b"][0][1] < 0.05
    elapsed = [e for _, e in seen["b"]]
    assert elapsed == sorted(elapsed) and elapsed[-1] >= 0.1
    assert queue.stats().longest_wait_s >= elapsed[-1]
    release.set()  # a runs and keeps its slot, so b moves up to place 1
    wait_until(lambda: seen["b"][-1][0] == 1)
    assert seen["a"] and {p for p, _ in seen["a"]} == {1}
    release_a.set()
    join(holder, ta, tb)
    assert queue.stats().served == 3


def test_no_callback_when_there_is_no_wait():
    queue = ForwardQueue(1)
    calls: list = []
    with queue.slot("a", on_wait=lambda *a: calls.append(a)):
        pass
    assert calls == []


def test_a_waiter_that_leaves_frees_its_place_at_once():
    queue = ForwardQueue(1, poll_s=0.02, rejoin_grace_s=0)
    release, holder = hold(queue)
    order: list[str] = []
    outcome: dict[str, object] = {}
    places: list[int] = []

    def visitor(name, on_wait=None):
        def body():
            try:
                with queue.slot(name, on_wait=on_wait):
                    order.append(name)
            except Stop:
                outcome[name] = "left"

        return body

    leave = threading.Event()

    def b_wait(place, elapsed):
        if leave.is_set():
            raise Stop()  # what Streamlit does when b's visitor closes the tab

    ta = start(visitor("a"))
    wait_until(lambda: queue.stats().waiting == 1)
    tb = start(visitor("b", b_wait))
    wait_until(lambda: queue.stats().waiting == 2)
    tc = start(visitor("c", lambda p, e: places.append(p)))
    wait_until(lambda: queue.stats().waiting == 3 and places)
    assert places[-1] == 3
    leave.set()
    join(tb)
    assert outcome == {"b": "left"}
    assert queue.stats().waiting == 2
    wait_until(lambda: places[-1] == 2)  # c moved up
    release.set()
    join(holder, ta, tc)
    assert order == ["a", "c"]
    assert queue.stats().left == 1 and queue.stats().served == 3


def test_an_exception_inside_the_slot_releases_it():
    queue = ForwardQueue(1)
    with pytest.raises(ValueError), queue.slot("a"):
        raise ValueError("forward pass failed")
    assert queue.stats().running == 0
    with pytest.raises(Stop), queue.slot("a"):
        raise Stop()
    assert queue.stats().running == 0
    got = []

    def other():
        with queue.slot("b", on_wait=lambda *a: got.append("waited")):
            got.append("in")

    join(start(other))
    assert got == ["in"]  # the slot was free at once


def test_an_exception_in_the_callback_propagates_and_leaves():
    queue = ForwardQueue(1, poll_s=0.01)
    release, holder = hold(queue)

    def bad(place, elapsed):
        raise RuntimeError("drawing failed")

    with pytest.raises(RuntimeError, match="drawing failed"), queue.slot("x", on_wait=bad):
        pass
    assert queue.stats().waiting == 0 and queue.stats().left == 1
    release.set()
    join(holder)


def test_a_session_that_reruns_while_waiting_keeps_its_place():
    queue = ForwardQueue(1, poll_s=0.01, rejoin_grace_s=5.0)
    release, holder = hold(queue)
    stop_a = threading.Event()
    order: list[str] = []

    def visitor(name, stop=None):
        def on_wait(place, elapsed):
            if stop is not None and stop.is_set():
                stop.clear()
                raise Stop()

        def body():
            try:
                with queue.slot(name, on_wait=on_wait):
                    order.append(name)
            except Stop:
                pass

        return body

    ta = start(visitor("a", stop_a))
    wait_until(lambda: queue.stats().waiting == 1)
    tb = start(visitor("b"))
    wait_until(lambda: queue.stats().waiting == 2)
    stop_a.set()  # a's visitor moved a slider: Streamlit stops the run ...
    join(ta)
    assert queue.place("a") is None and queue.place("b") == 1
    ta2 = start(visitor("a"))  # ... and reruns it at once
    wait_until(lambda: queue.place("a") == 1)
    assert queue.place("b") == 2
    release.set()
    join(holder, ta2, tb)
    assert order == ["a", "b"]


def test_after_the_grace_period_a_session_goes_to_the_end():
    now = [0.0]
    queue = ForwardQueue(1, poll_s=0.01, rejoin_grace_s=2.0, clock=lambda: now[0])
    release, holder = hold(queue)
    leave = threading.Event()
    left = threading.Event()
    order: list[str] = []

    def visitor(name, on_wait=None):
        def body():
            try:
                with queue.slot(name, on_wait=on_wait):
                    order.append(name)
            except Stop:
                left.set()

        return body

    def a_wait(place, elapsed):
        if leave.is_set():
            raise Stop()

    ta = start(visitor("a", a_wait))  # joins at t = 0
    wait_until(lambda: queue.place("a") == 1)
    now[0] = 1.0
    tb = start(visitor("b"))  # joins at t = 1
    wait_until(lambda: queue.place("b") == 2)
    leave.set()
    now[0] = 1.5  # a's next callback is due: it leaves at t = 1.5
    join(ta)
    assert left.is_set() and queue.place("b") == 1
    now[0] = 4.0  # more than 2 s later
    ta2 = start(visitor("a"))
    wait_until(lambda: queue.place("a") == 2)
    assert queue.place("b") == 1
    release.set()
    join(holder, tb, ta2)
    assert order == ["b", "a"]


def test_from_settings():
    assert ForwardQueue.from_settings(ServeSettings(public=True, forward_slots=2)).slots == 2
    assert ForwardQueue.from_settings(ServeSettings()).slots == 0
    with pytest.raises(ValueError):
        ForwardQueue(-1)
