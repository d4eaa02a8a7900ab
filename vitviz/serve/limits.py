"""Rate limits: a sliding window of recent events, and a polite message saying when to try again.

Per session (keep a :class:`SessionLimits` in the session's state):

* uploads: ``uploads_per_minute`` new images (public default 10), and as many results
  files on the Data set page; count an upload only when a new file arrives, not on every
  rerun that still shows it;
* model changes: ``model_changes_per_minute`` (public default 5); count a change only when
  the model name differs from the session's current one.

For the whole server, :func:`hub_download_limit` bounds how many typed hub ids are
downloaded per hour (public default 20), so visitors cannot fill the server's disk.

A limit of 0 means no limit (the local-mode default). Every event is counted at the moment
it is allowed; a refused attempt is not counted, so waiting as told always works. The clock is
injectable for tests.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from vitviz.errors import VitvizError

__all__ = [
    "RateLimit",
    "RateLimitError",
    "SessionLimits",
    "hub_download_limit",
    "format_wait",
    "UPLOADS",
    "RESULTS_UPLOADS",
    "MODEL_CHANGES",
    "HUB_DOWNLOADS",
]

UPLOADS = (
    "You have uploaded {limit} images in the last minute, the most this server allows. "
    "Please try again in {wait}; meanwhile the current image stays."
)
RESULTS_UPLOADS = (
    "You have uploaded {limit} results files in the last minute, the most this server allows. "
    "Please try again in {wait}."
)
MODEL_CHANGES = (
    "You have changed the model {limit} times in the last minute, the most this server allows. "
    "Please try again in {wait}; meanwhile the current model stays."
)
HUB_DOWNLOADS = (
    "This server has downloaded {limit} new models from the Hugging Face hub in the last hour, the most it "
    "allows. Please try again in {wait}, or choose a model from the list."
)


class RateLimitError(VitvizError):
    """Too many events in the window; ``retry_after`` is the number of seconds until one more is allowed."""

    def __init__(self, message: str, retry_after: float) -> None:
        super().__init__(message)
        self.retry_after = retry_after


def format_wait(seconds: float) -> str:
    """``1 second``, ``12 seconds``, ``2 minutes``: whole units, rounded up, never ``0``."""
    secs = max(1, math.ceil(seconds - 1e-9))
    if secs < 90:
        return f"{secs} second{'s' if secs != 1 else ''}"
    minutes = math.ceil(secs / 60)
    return f"{minutes} minutes"


class RateLimit:
    """At most ``limit`` events in any ``window_s`` seconds (a sliding window); thread-safe.

    ``message`` is a template with ``{limit}`` and ``{wait}`` (see :func:`format_wait`).
    """

    def __init__(
        self,
        limit: int,
        window_s: float = 60.0,
        *,
        message: str = "Too many requests: at most {limit} in a row. Please try again in {wait}.",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if limit < 0 or window_s <= 0:
            raise ValueError("a rate limit needs limit >= 0 (0: no limit) and a positive window")
        self.limit, self.window_s, self.message, self._clock = limit, window_s, message, clock
        self._events: deque[float] = deque()
        self._lock = threading.Lock()

    def _expire(self, now: float) -> None:
        while self._events and now - self._events[0] >= self.window_s:
            self._events.popleft()

    def retry_after(self) -> float:
        """Seconds until one more event is allowed (0 when it is allowed now)."""
        if self.limit == 0:
            return 0.0
        with self._lock:
            now = self._clock()
            self._expire(now)
            if len(self._events) < self.limit:
                return 0.0
            return self._events[0] + self.window_s - now

    def remaining(self) -> int | None:
        """Events still allowed now; None when there is no limit."""
        if self.limit == 0:
            return None
        with self._lock:
            self._expire(self._clock())
            return self.limit - len(self._events)

    def acquire(self) -> None:
        """Count one event, or raise :class:`RateLimitError` (counting nothing) when the window is full."""
        if self.limit == 0:
            return
        with self._lock:
            now = self._clock()
            self._expire(now)
            if len(self._events) >= self.limit:
                wait = self._events[0] + self.window_s - now
                raise RateLimitError(self.message.format(limit=self.limit, wait=format_wait(wait)), wait)
            self._events.append(now)

    def reset(self) -> None:
        with self._lock:
            self._events.clear()


@dataclass
class SessionLimits:
    """One visitor's limits; create it once per session with :meth:`from_settings`."""

    uploads: RateLimit
    model_changes: RateLimit
    results_uploads: RateLimit | None = None  # results files (Data set page): ``uploads_per_minute`` as well

    @classmethod
    def from_settings(cls, settings: Any, *, clock: Callable[[], float] = time.monotonic) -> SessionLimits:
        return cls(
            uploads=RateLimit(settings.uploads_per_minute, 60.0, message=UPLOADS, clock=clock),
            model_changes=RateLimit(settings.model_changes_per_minute, 60.0, message=MODEL_CHANGES, clock=clock),
            results_uploads=RateLimit(settings.uploads_per_minute, 60.0, message=RESULTS_UPLOADS, clock=clock),
        )


def hub_download_limit(settings: Any, *, clock: Callable[[], float] = time.monotonic) -> RateLimit:
    """The server-wide limit on typed hub ids downloaded per hour (one object for the whole server)."""
    return RateLimit(settings.hub_downloads_per_hour, 3600.0, message=HUB_DOWNLOADS, clock=clock)
