"""The pools' local buffer of fetched ids with their expiry (no locking)."""

from __future__ import annotations

from collections import deque

__all__ = ["Buffer"]


class Buffer:
    """Ids in fetch order, each batch dropped once ``max_age`` seconds old."""

    def __init__(self, max_age: float) -> None:
        self._max_age = max_age
        # Batches after the current one: (expires at, ids).
        self._later: deque[tuple[float, list[int]]] = deque()
        self._ids: list[int] = []
        self._pos = 0
        self._expires = 0.0
        #: Ids buffered (expired ones included until the next take).
        self.count = 0

    def add(self, ids: list[int], fetched_at: float) -> None:
        """Appends a batch fetched at ``fetched_at`` (monotonic seconds)."""
        if ids:
            self._later.append((fetched_at + self._max_age, ids))
            self.count += len(ids)

    def _advance(self, now: float) -> bool:
        """Moves to the next unexpired batch; False when none is left."""
        self.count -= len(self._ids) - self._pos
        self._ids, self._pos = [], 0
        while self._later:
            expires, ids = self._later.popleft()
            if expires > now:
                self._ids, self._expires = ids, expires
                return True
            self.count -= len(ids)
        return False

    def take(self, now: float) -> int | None:
        """The oldest unexpired id, or None when the buffer holds none."""
        if self._pos >= len(self._ids) or self._expires <= now:
            if not self._advance(now):
                return None
        id = self._ids[self._pos]
        self._pos += 1
        self.count -= 1
        return id

    def drop_expired(self, now: float) -> None:
        """Forgets batches that are ``max_age`` old (so ``count`` is true)."""
        if self._expires <= now and self._pos < len(self._ids):
            self._advance(now)
        while self._later and self._later[0][0] <= now:
            self.count -= len(self._later.popleft()[1])
