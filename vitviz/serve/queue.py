"""At most K forward passes at once in the server; the others wait their turn in a FIFO queue.

Wrap each forward pass (a capture, a relevance pass, a text-tower pass) in
``with queue.slot(session_id, on_wait=show):``. Anything that needs no forward pass (moving
a slider over a cached capture, redrawing a figure) never touches the queue.

* FIFO: the longest-waiting ticket runs first; K slots run at once (``slots=0``: no limit,
  nobody waits, the counts are still kept).
* ``on_wait(place, elapsed_s)`` is called as soon as a ticket has to wait, then every
  ``poll_s`` seconds (default 0.25): ``place`` 1 means "next". The UI draws it; when the
  visitor leaves, Streamlit raises ``StopException`` from inside that drawing call, and the
  ticket leaves the queue at once, freeing its place. Any exception (or ``BaseException``)
  in the waiting thread does the same; an exception inside the ``with`` block frees the slot.
* A session that leaves the queue and joins again within ``rejoin_grace_s`` (Streamlit
  reruns a script when its visitor moves a slider while waiting) gets its old place back
  instead of going to the end of the line.
"""

from __future__ import annotations

import bisect
import itertools
import threading
import time
from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

__all__ = ["ForwardQueue", "QueueStats", "WaitCallback"]

WaitCallback = Callable[[int, float], None]


@dataclass(frozen=True)
class QueueStats:
    slots: int  # 0: no limit
    running: int
    waiting: int
    served: int  # slots granted since start
    left: int  # tickets that left the queue before their turn
    longest_wait_s: float  # of those waiting now


@dataclass(order=True)
class _Ticket:
    arrival: float
    seq: int
    owner: Hashable = field(compare=False)


class ForwardQueue:
    """A FIFO semaphore with ``slots`` places, callbacks for waiters, and statistics."""

    def __init__(
        self,
        slots: int,
        *,
        poll_s: float = 0.25,
        rejoin_grace_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if slots < 0:
            raise ValueError("slots must be 0 (no limit) or more")
        self.slots, self.poll_s, self.rejoin_grace_s, self._clock = slots, poll_s, rejoin_grace_s, clock
        self._cond = threading.Condition()
        self._waiting: list[_Ticket] = []  # sorted by (arrival, seq)
        self._running = 0
        self._served = self._left = 0
        self._seq = itertools.count()
        self._gone: dict[Hashable, tuple[float, float]] = {}  # owner -> (arrival, when it left)

    @classmethod
    def from_settings(cls, settings: Any, **kwargs: Any) -> ForwardQueue:
        return cls(settings.forward_slots, **kwargs)

    def stats(self) -> QueueStats:
        with self._cond:
            now = self._clock()
            longest = max((now - t.arrival for t in self._waiting), default=0.0)
            return QueueStats(self.slots, self._running, len(self._waiting), self._served, self._left, longest)

    def place(self, owner: Hashable) -> int | None:
        """1-based place in line of ``owner``'s first waiting ticket, or None."""
        with self._cond:
            return next((i + 1 for i, t in enumerate(self._waiting) if t.owner == owner), None)

    @contextmanager
    def slot(self, owner: Hashable = None, on_wait: WaitCallback | None = None) -> Iterator[None]:
        """Hold one of the K slots for the body of the ``with``; wait in line first if all are taken.

        Args:
            owner: who is asking (the session id): its place is kept if it rejoins within
                ``rejoin_grace_s``; None never rejoins.
            on_wait: ``on_wait(place, elapsed_s)``, called only while waiting: at once, then
                every ``poll_s`` seconds; ``elapsed_s`` counts from the session's first join
                when it rejoined within the grace period. What it raises leaves the queue and
                propagates.
        """
        ticket = self._join(owner)
        try:
            self._wait_turn(ticket, on_wait)
        except BaseException:
            self._leave(ticket)
            raise
        try:
            yield
        finally:
            with self._cond:
                self._running -= 1
                self._cond.notify_all()

    def _join(self, owner: Hashable) -> _Ticket:
        with self._cond:
            now = self._clock()
            self._gone = {o: v for o, v in self._gone.items() if now - v[1] <= self.rejoin_grace_s}
            arrival = self._gone.pop(owner)[0] if owner is not None and owner in self._gone else now
            ticket = _Ticket(arrival, next(self._seq), owner)
            bisect.insort(self._waiting, ticket)
            return ticket

    def _turn(self, ticket: _Ticket) -> bool:
        """Whether ``ticket`` may run now: no limit, or first in line with a free slot (lock held)."""
        return self.slots == 0 or (self._waiting[0] is ticket and self._running < self.slots)

    def _wait_turn(self, ticket: _Ticket, on_wait: WaitCallback | None) -> None:
        next_call = None  # when to call on_wait next; None: it has not been called yet
        while True:
            with self._cond:
                if self._turn(ticket):
                    self._waiting.remove(ticket)
                    self._running += 1
                    self._served += 1
                    self._cond.notify_all()  # the next in line may have a free slot too
                    return
                now = self._clock()
                if next_call is not None and now < next_call:
                    self._cond.wait(timeout=min(self.poll_s, next_call - now))
                    continue
                place = self._waiting.index(ticket) + 1
            next_call = now + self.poll_s
            if on_wait is not None:
                on_wait(place, now - ticket.arrival)  # outside the lock: it may draw, block or raise

    def _leave(self, ticket: _Ticket) -> None:
        with self._cond:
            if ticket in self._waiting:
                self._waiting.remove(ticket)
            self._left += 1
            if ticket.owner is not None:
                self._gone[ticket.owner] = (ticket.arrival, self._clock())
            self._cond.notify_all()
