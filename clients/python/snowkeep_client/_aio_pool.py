"""The asyncio prefetching pool: :class:`AsyncPool`."""

from __future__ import annotations

import asyncio
import contextlib
import time
from types import TracebackType
from typing import TYPE_CHECKING

from ._buffer import Buffer
from ._errors import pool_closed
from ._options import check_pool

if TYPE_CHECKING:
    from ._aio import AsyncClient

__all__ = ["AsyncPool"]


class AsyncPool:
    """The asyncio twin of :class:`snowkeep_client.Pool`: the same sizes,
    refill rule, max age and errors; a task of the running loop refills it.

    Build it inside a running event loop (``client.pool(...)``); use
    ``async with`` or ``await pool.aclose()``.
    """

    def __init__(
        self,
        client: AsyncClient,
        *,
        batch: int = 100,
        low_water: int | None = None,
        max_age: float = 600.0,
    ) -> None:
        self._batch, self._low, max_age = check_pool(batch, low_water, max_age)
        self._client = client
        self._buf = Buffer(max_age)
        self._closed = False
        self._want = asyncio.Event()
        self._want.set()
        self._changed = asyncio.Event()
        self._failures = 0
        self._error: BaseException | None = None
        self._task = asyncio.get_running_loop().create_task(self._refill_loop())

    async def __aenter__(self) -> AsyncPool:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    @property
    def buffered(self) -> int:
        """Ids in the buffer now."""
        self._buf.drop_expired(time.monotonic())
        return self._buf.count

    async def next(self, timeout: float | None = None) -> int:
        """One id; waits for a refill when the buffer is empty.

        Raises the refill's last error when a refill fails while it waits,
        :class:`TimeoutError` after ``timeout`` seconds, "pool closed"
        (``FAILED_PRECONDITION``) after :meth:`aclose`.
        """
        seen = self._failures
        end = None if timeout is None else time.monotonic() + timeout
        while True:
            if self._closed:
                raise pool_closed()
            id = self._buf.take(time.monotonic())
            if id is not None:
                if self._buf.count <= self._low:
                    self._want.set()
                return id
            if self._failures != seen and self._error is not None:
                raise self._error
            self._want.set()
            changed = self._changed
            if end is None:
                await changed.wait()
            else:
                left = end - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"no id within {timeout} s")
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(changed.wait(), left)

    async def aclose(self) -> None:
        """Stops the refill task (cancelling a refill in flight) and waits for
        it; :meth:`next` then raises "pool closed". Idempotent."""
        self._closed = True
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self._signal()

    def _signal(self) -> None:
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def _refill_loop(self) -> None:
        while not self._closed:
            await self._want.wait()
            self._want.clear()
            try:
                ids = await self._client.next_ids(self._batch)
            except Exception as e:
                self._failures += 1
                self._error = e
            else:
                now = time.monotonic()
                self._buf.add(ids, now)
                self._buf.drop_expired(now)
                if self._buf.count <= self._low:
                    self._want.set()
            self._signal()
