"""The retry rule, shared by the sync and the asyncio client (no I/O here).

:class:`Endpoints` chooses a server: round-robin, skipping ejected ones.
:class:`Attempts` is one call's plan: which endpoint next, each attempt's
deadline, the sleep after each full round and the retry budget. The clients
run the I/O; this module decides.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import grpc

from ._errors import SnowkeepError, is_retryable

__all__ = ["Attempt", "Attempts", "CallerDeadline", "Endpoints"]

Clock = Callable[[], float]


class CallerDeadline(Exception):
    """The caller's own ``timeout`` passed (internal: raised as TimeoutError)."""


class Endpoints:
    """Round-robin choice with ejection; safe to share between threads.

    An endpoint whose last attempt failed with a retryable code is ejected
    for ``backoff`` doubling per consecutive failure, up to ``max_backoff``;
    a success clears it. When every endpoint is ejected, the one whose
    ejection ends first is chosen.
    """

    def __init__(self, count: int, backoff: float, max_backoff: float, clock: Clock) -> None:
        self._count = count
        self._backoff = backoff
        self._max_backoff = max_backoff
        self._clock = clock
        self._lock = threading.Lock()
        self._next = 0
        self._failures = [0] * count
        self._ejected_until = [0.0] * count

    @property
    def count(self) -> int:
        """How many endpoints there are."""
        return self._count

    def pick(self, exclude: frozenset[int] = frozenset()) -> int:
        """The next endpoint to call, preferring ones not in ``exclude``."""
        with self._lock:
            now = self._clock()
            start = self._next
            for preferred in (True, False):
                for k in range(self._count):
                    i = (start + k) % self._count
                    if self._ejected_until[i] <= now and (not preferred or i not in exclude):
                        self._next = i + 1
                        return i
            i = min(range(self._count), key=lambda j: self._ejected_until[j])
            self._next = i + 1
            return i

    def failed(self, i: int) -> None:
        """Ejects endpoint ``i`` after a retryable failure."""
        with self._lock:
            self._failures[i] += 1
            doubling = min(self._failures[i] - 1, 30)
            span = min(self._backoff * (2**doubling), self._max_backoff)
            self._ejected_until[i] = self._clock() + span

    def succeeded(self, i: int) -> None:
        """Clears endpoint ``i``'s ejection."""
        with self._lock:
            self._failures[i] = 0
            self._ejected_until[i] = 0.0

    def ejected(self) -> list[bool]:
        """Which endpoints are ejected now (for tests and diagnostics)."""
        with self._lock:
            now = self._clock()
            return [t > now for t in self._ejected_until]


@dataclass(frozen=True)
class Attempt:
    """One attempt: the endpoint's index and the attempt's deadline in seconds."""

    endpoint: int
    timeout: float
    #: True when the caller's own timeout, not ours, bounds this attempt.
    caller_bound: bool
    #: True when the retry budget's end, not ``request_timeout``, bounds this
    #: attempt: its ``DEADLINE_EXCEEDED`` ran out of budget, not of server
    #: time, and the failure before it stays the one a spent budget reports.
    budget_bound: bool = False


class Attempts:
    """One call's retry plan (see the module doc and conformance/README.md)."""

    def __init__(
        self,
        endpoints: Endpoints,
        *,
        request_timeout: float,
        retry_budget: float,
        backoff: float,
        max_backoff: float,
        caller_timeout: float | None = None,
        clock: Clock = time.monotonic,
        rng: Callable[[], float] = random.random,
    ) -> None:
        self._endpoints = endpoints
        self._request_timeout = request_timeout
        self._budget = retry_budget
        self._first_backoff = backoff
        self._max_backoff = max_backoff
        self._clock = clock
        self._rng = rng
        now = clock()
        self._caller_end = None if caller_timeout is None else now + caller_timeout
        self._last: SnowkeepError | None = None
        self.restart()

    def restart(self) -> None:
        """A fresh budget and round (a stream's batch arrived). The failures
        before it are forgotten: the batch shows they healed, so a spent
        budget later reports only what failed after it."""
        self._last = None
        self._budget_end = self._clock() + self._budget
        self._backoff = self._first_backoff
        self._tried: set[int] = set()

    @property
    def last_error(self) -> SnowkeepError | None:
        """The last retryable failure, if any."""
        return self._last

    def batch_wait(self) -> float:
        """How long a stream's next wait for a batch may last, in seconds:
        the smaller of ``request_timeout`` and the budget left (after a batch,
        a fresh budget)."""
        return max(min(self._request_timeout, self._budget_end - self._clock()), 0.0)

    def _spent(self) -> SnowkeepError:
        if self._last is not None:
            return SnowkeepError(self._last.code, self._last.message)
        return SnowkeepError(
            grpc.StatusCode.DEADLINE_EXCEEDED, "retry budget spent before any attempt"
        )

    def start(self) -> Attempt:
        """The next attempt; raises the last error once the budget is spent,
        and :class:`CallerDeadline` once the caller's timeout has passed."""
        now = self._clock()
        left = self._budget_end - now
        if left <= 0:
            raise self._spent()
        timeout = min(self._request_timeout, left)
        budget_bound = left < self._request_timeout
        caller_bound = False
        if self._caller_end is not None:
            caller_left = self._caller_end - now
            if caller_left <= 0:
                raise CallerDeadline()
            if caller_left < timeout:
                timeout, caller_bound, budget_bound = caller_left, True, False
        i = self._endpoints.pick(frozenset(self._tried))
        self._tried.add(i)
        return Attempt(i, timeout, caller_bound, budget_bound)

    def succeeded(self, attempt: Attempt) -> None:
        """The attempt's endpoint answered."""
        self._endpoints.succeeded(attempt.endpoint)

    def failed(self, attempt: Attempt, error: SnowkeepError) -> float:
        """Records a failed attempt; returns how long to sleep before the next.

        Raises ``error`` at once when it is not retryable, the last error when
        the budget is spent, and :class:`CallerDeadline` when the caller's
        timeout ended the attempt.
        """
        now = self._clock()
        if attempt.caller_bound and error.code == grpc.StatusCode.DEADLINE_EXCEEDED:
            raise CallerDeadline()
        if not is_retryable(error.code):
            raise error
        self._endpoints.failed(attempt.endpoint)
        cut = attempt.budget_bound and error.code == grpc.StatusCode.DEADLINE_EXCEEDED
        kept = self._last if cut and self._last is not None else error
        self._last = kept
        left = self._budget_end - now
        if left <= 0:
            raise kept
        if len(self._tried) < self._endpoints.count:
            return 0.0
        # Every endpoint failed in this round: back off, then a new round.
        self._tried = set()
        delay = self._backoff * (0.8 + 0.4 * self._rng())
        self._backoff = min(self._backoff * 2, self._max_backoff)
        if self._caller_end is not None:
            delay = min(delay, max(self._caller_end - now, 0.0))
        return min(delay, left)
