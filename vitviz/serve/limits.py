"""Rate limits: a sliding window of recent events, and a polite message saying when to try again.

Per session (keep a :class:`SessionLimits` in the session's state):

* uploads: ``uploads_per_minute`` new images (public default 10), and as many results
  files on the Data set page; count an upload only when a new file arrives, not on every
  rerun that still shows it;
* model changes: ``model_changes_per_minute`` (public default 5); count a change only when
  the model name differs from the session's current one.

Per client address as well (public mode, ``per_address``): a new session (a page reload) starts
with fresh session limits, so the same numbers also count per address, in one process-wide
:class:`AddressLimits` table, least recently used addresses forgotten past
``address_table_size`` (10,000) so that many addresses never grow it.
:meth:`SessionLimits.with_address` gives the limits a session uses: an event counts in both, and
a refusal by either counts in neither. Visitors behind one proxy (or one NAT) share an address,
so they share its limit.

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
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from vitviz.errors import VitvizError

__all__ = [
    "RateLimit",
    "RateLimits",
    "RateLimitError",
    "SessionLimits",
    "AddressLimits",
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

    def cancel(self) -> None:
        """Take back one event counted (the latest): an event another limit refused counts in none."""
        with self._lock:
            if self._events:
                self._events.pop()

    def reset(self) -> None:
        with self._lock:
            self._events.clear()


class RateLimits:
    """Several limits on the same events (a session's and its address's): :meth:`acquire` counts in all or in none.

    Duck-types :class:`RateLimit` (``acquire``, ``retry_after``, ``remaining``); the message of a refusal is that of
    the limit that refused.
    """

    def __init__(self, *limits: RateLimit) -> None:
        self.limits = tuple(limits)

    def acquire(self) -> None:
        taken: list[RateLimit] = []
        try:
            for limit in self.limits:
                limit.acquire()
                taken.append(limit)
        except RateLimitError:
            for limit in taken:
                limit.cancel()
            raise

    def retry_after(self) -> float:
        return max((limit.retry_after() for limit in self.limits), default=0.0)

    def remaining(self) -> int | None:
        left = [r for r in (limit.remaining() for limit in self.limits) if r is not None]
        return min(left) if left else None


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

    def with_address(self, address: SessionLimits) -> SessionLimits:
        """These limits and ``address``'s together (:class:`RateLimits`): what a session of that address uses."""
        results = [x for x in (self.results_uploads, address.results_uploads) if x is not None]
        return SessionLimits(
            uploads=RateLimits(self.uploads, address.uploads),
            model_changes=RateLimits(self.model_changes, address.model_changes),
            results_uploads=RateLimits(*results),
        )


class AddressLimits:
    """The limits of each client address, for the whole process: at most ``settings.address_table_size`` addresses,
    the least recently seen forgotten first (their counts with them). Thread-safe."""

    def __init__(self, settings: Any, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.settings, self.clock = settings, clock
        self.max_addresses = int(getattr(settings, "address_table_size", 10_000))
        self._table: OrderedDict[str, SessionLimits] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._table)

    def __contains__(self, address: str) -> bool:
        return address in self._table

    def get(self, address: str) -> SessionLimits:
        """The limits of ``address`` (created on first sight)."""
        with self._lock:
            limits = self._table.get(address)
            if limits is None:
                limits = self._table[address] = SessionLimits.from_settings(self.settings, clock=self.clock)
                while len(self._table) > self.max_addresses:
                    self._table.popitem(last=False)
            self._table.move_to_end(address)
            return limits


def hub_download_limit(settings: Any, *, clock: Callable[[], float] = time.monotonic) -> RateLimit:
    """The server-wide limit on typed hub ids downloaded per hour (one object for the whole server)."""
    return RateLimit(settings.hub_downloads_per_hour, 3600.0, message=HUB_DOWNLOADS, clock=clock)
