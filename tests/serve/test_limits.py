"""Rate limits: sliding windows, exact polite messages, unlimited local mode."""

from __future__ import annotations

import threading

import pytest

from vitviz.errors import VitvizError
from vitviz.serve.limits import RateLimit, RateLimitError, SessionLimits, format_wait, hub_download_limit
from vitviz.serve.settings import ServeSettings


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def refused(limit: RateLimit) -> RateLimitError:
    with pytest.raises(RateLimitError) as err:
        limit.acquire()
    assert isinstance(err.value, VitvizError)
    return err.value


def test_uploads_per_minute():
    clock = Clock()
    limits = SessionLimits.from_settings(ServeSettings(public=True), clock=clock)
    for _ in range(10):
        limits.uploads.acquire()
        clock.now += 1  # one upload a second
    clock.now = 1009.5
    err = refused(limits.uploads)
    assert str(err) == (
        "You have uploaded 10 images in the last minute, the most this server allows. "
        "Please try again in 51 seconds; meanwhile the current image stays."
    )
    assert err.retry_after == pytest.approx(50.5)
    assert limits.uploads.retry_after() == pytest.approx(50.5) and limits.uploads.remaining() == 0


def test_model_changes_per_minute():
    clock = Clock()
    limits = SessionLimits.from_settings(ServeSettings(public=True), clock=clock)
    for _ in range(5):
        limits.model_changes.acquire()
    clock.now += 59.5
    err = refused(limits.model_changes)
    assert str(err) == (
        "You have changed the model 5 times in the last minute, the most this server allows. "
        "Please try again in 1 second; meanwhile the current model stays."
    )
    limits.uploads.acquire()  # the other limit is separate


def test_the_window_slides():
    clock = Clock()
    limit = RateLimit(3, 60.0, clock=clock)
    for t in (0, 10, 20):
        clock.now = 1000 + t
        limit.acquire()
    clock.now = 1059.9
    refused(limit)
    clock.now = 1060.0  # the first event is a minute old: one more is allowed
    limit.acquire()
    refused(limit)
    clock.now = 1070.0
    assert limit.remaining() == 1
    limit.acquire()


def test_a_refused_attempt_is_not_counted():
    clock = Clock()
    limit = RateLimit(1, 60.0, clock=clock)
    limit.acquire()
    for _ in range(20):  # hammering does not push the next allowed time back
        clock.now += 1
        refused(limit)
    clock.now = 1060.0
    limit.acquire()


def test_hub_downloads_per_hour():
    clock = Clock()
    limit = hub_download_limit(ServeSettings(public=True), clock=clock)
    for _ in range(20):
        limit.acquire()
    err = refused(limit)
    assert str(err) == (
        "This server has downloaded 20 new models from the Hugging Face hub in the last hour, the most it "
        "allows. Please try again in 60 minutes, or choose a model from the list."
    )


def test_zero_means_no_limit_and_local_mode_has_none():
    limits = SessionLimits.from_settings(ServeSettings())
    for _ in range(1000):
        limits.uploads.acquire()
        limits.model_changes.acquire()
    assert limits.uploads.remaining() is None and limits.uploads.retry_after() == 0.0
    assert hub_download_limit(ServeSettings()).limit == 0


def test_explicit_settings_are_used():
    limits = SessionLimits.from_settings(ServeSettings(public=True, uploads_per_minute=2, model_changes_per_minute=1))
    assert (limits.uploads.limit, limits.model_changes.limit) == (2, 1)


def test_reset():
    limit = RateLimit(1, clock=Clock())
    limit.acquire()
    limit.reset()
    limit.acquire()


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0.0, "1 second"),
        (0.2, "1 second"),
        (1.0, "1 second"),
        (1.01, "2 seconds"),
        (59.0, "59 seconds"),
        (89.0, "89 seconds"),
        (90.0, "2 minutes"),
        (3599.0, "60 minutes"),
    ],
)
def test_format_wait(seconds, text):
    assert format_wait(seconds) == text


def test_thread_safe():
    limit = RateLimit(10, 60.0)
    allowed: list[int] = []
    lock = threading.Lock()

    def hit():
        for _ in range(10):
            try:
                limit.acquire()
            except RateLimitError:
                continue
            with lock:
                allowed.append(1)

    threads = [threading.Thread(target=hit) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(allowed) == 10


def test_bad_arguments():
    with pytest.raises(ValueError):
        RateLimit(-1)
    with pytest.raises(ValueError):
        RateLimit(1, 0)


# -- issue 33.15: per-session limits reset with a new session; the address's do not ------------------------------


def test_a_new_session_from_the_same_address_shares_its_limits():
    from vitviz.serve.limits import AddressLimits

    clock = Clock()
    settings = ServeSettings(public=True, uploads_per_minute=2)
    table = AddressLimits(settings, clock=clock)
    first = SessionLimits.from_settings(settings, clock=clock).with_address(table.get("203.0.113.7"))
    first.uploads.acquire()
    first.uploads.acquire()
    err = refused(first.uploads)
    assert "You have uploaded 2 images in the last minute" in str(err)
    fresh = SessionLimits.from_settings(settings, clock=clock).with_address(table.get("203.0.113.7"))
    refused(fresh.uploads)  # a reload is a new session, not new uploads
    assert fresh.uploads.remaining() == 0
    elsewhere = SessionLimits.from_settings(settings, clock=clock).with_address(table.get("198.51.100.1"))
    elsewhere.uploads.acquire()
    clock.now += 60
    fresh.uploads.acquire()  # the window slides for the address too


def test_a_refusal_by_one_limit_counts_in_neither():
    from vitviz.serve.limits import AddressLimits

    clock = Clock()
    settings = ServeSettings(public=True, model_changes_per_minute=3)
    table = AddressLimits(settings, clock=clock)
    session = SessionLimits.from_settings(settings, clock=clock)
    for _ in range(3):
        session.model_changes.acquire()  # the session's window is full, the address's empty
    both = session.with_address(table.get("203.0.113.7"))
    refused(both.model_changes)
    assert table.get("203.0.113.7").model_changes.remaining() == 3  # nothing counted for the address


def test_the_address_table_is_bounded_least_recently_used_first():
    from vitviz.serve.limits import AddressLimits

    table = AddressLimits(ServeSettings(public=True, address_table_size=3))
    kept = table.get("10.0.0.1")
    for i in range(2, 6):
        table.get(f"10.0.0.{i}")
        table.get("10.0.0.1")  # used again: kept
    assert len(table) == 3 and table.get("10.0.0.1") is kept
    assert "10.0.0.2" not in table and "10.0.0.5" in table
    threads = [
        threading.Thread(target=lambda n=n: [table.get(f"192.0.2.{n}.{k}") for k in range(200)]) for n in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(table) == 3  # many addresses never grow it
