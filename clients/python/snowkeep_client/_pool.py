"""The synchronous prefetching pool: :class:`Pool`."""

from __future__ import annotations

import threading
import time
from types import TracebackType
from typing import TYPE_CHECKING

from ._buffer import Buffer
from ._client import _Cancel
from ._errors import pool_closed
from ._options import check_pool

if TYPE_CHECKING:
    from ._client import Client

__all__ = ["Pool"]


class Pool:
    """Ids fetched ahead of use, so :meth:`next` is usually a local pop.

    A background thread fetches ``batch`` ids (1 to 100,000) with
    ``next_ids`` at the start and whenever the buffer holds ``low_water`` ids
    or fewer (default ``batch // 4``); at most one refill is in flight. Ids
    older than ``max_age`` seconds (default 600, counted from their fetch) are
    dropped, never handed out. Ids ascend within each fetched batch, not
    across batches. Bad sizes raise ``INVALID_ARGUMENT`` naming ``batch``,
    ``low_water`` or ``max_age``. Thread-safe; a context manager; call
    :meth:`close` to stop the background thread.
    """

    def __init__(
        self,
        client: Client,
        *,
        batch: int = 100,
        low_water: int | None = None,
        max_age: float = 600.0,
    ) -> None:
        self._batch, self._low, max_age = check_pool(batch, low_water, max_age)
        self._client = client
        self._buf = Buffer(max_age)
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._filled = threading.Condition(self._lock)
        self._closed = False
        self._want = True
        self._failures = 0
        self._error: BaseException | None = None
        self._cancel = _Cancel()
        self._thread = threading.Thread(target=self._refill_loop, name="snowkeep-pool", daemon=True)
        self._thread.start()

    def __enter__(self) -> Pool:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    @property
    def buffered(self) -> int:
        """Ids in the buffer now (expired ones are dropped on the next take)."""
        with self._lock:
            self._buf.drop_expired(time.monotonic())
            return self._buf.count

    def next(self, timeout: float | None = None) -> int:
        """One id. Waits for a refill when the buffer is empty.

        Raises the refill's last error (a :class:`SnowkeepError`, e.g. the
        last retryable failure once the retry budget is spent) when a refill
        fails while this call waits; :class:`TimeoutError` when ``timeout``
        seconds pass first; ``FAILED_PRECONDITION`` "pool closed" after
        :meth:`close`.
        """
        with self._lock:
            seen = self._failures
            end = None if timeout is None else time.monotonic() + timeout
            while True:
                if self._closed:
                    raise pool_closed()
                id = self._buf.take(time.monotonic())
                if id is not None:
                    if self._buf.count <= self._low and not self._want:
                        self._want = True
                        self._wake.notify()
                    return id
                if self._failures != seen and self._error is not None:
                    raise self._error
                if not self._want:
                    self._want = True
                    self._wake.notify()
                left = None if end is None else end - time.monotonic()
                if left is not None and left <= 0:
                    raise TimeoutError(f"no id within {timeout} s")
                self._filled.wait(left)

    def close(self) -> None:
        """Stops the background refill (cancelling one in flight) and waits
        for its thread; :meth:`next` then raises "pool closed". Idempotent."""
        with self._lock:
            self._closed = True
            self._wake.notify_all()
            self._filled.notify_all()
        self._cancel.cancel()
        if threading.current_thread() is not self._thread:
            self._thread.join()

    def _refill_loop(self) -> None:
        while True:
            with self._lock:
                while not self._closed and not self._want:
                    self._wake.wait()
                if self._closed:
                    return
            ids: list[int] = []
            error: BaseException | None = None
            try:
                ids = self._client._next_ids(self._batch, None, self._cancel)
            except Exception as e:
                error = e
            with self._lock:
                if self._closed:
                    return
                now = time.monotonic()
                if error is None:
                    self._buf.add(ids, now)
                    self._buf.drop_expired(now)
                    self._want = self._buf.count <= self._low
                else:
                    self._failures += 1
                    self._error = error
                    self._want = False
                self._filled.notify_all()
