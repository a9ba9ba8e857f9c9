"""The asyncio client (grpc.aio): :class:`AsyncClient`, :class:`AsyncIdStream`."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, TypeVar

import grpc
import grpc.aio

from ._errors import SnowkeepError, client_closed, from_rpc_error, invalid_argument
from ._gen.snowkeep.v1 import id_pb2, id_pb2_grpc, info_pb2, info_pb2_grpc
from ._layout import DecodedId, Layout, layout_of
from ._options import Tls, build_settings, check_count, check_stream, check_timeout
from ._retry import Attempt, Attempts, CallerDeadline, Endpoints

if TYPE_CHECKING:
    from ._aio_pool import AsyncPool

__all__ = ["AsyncClient", "AsyncIdStream"]

T = TypeVar("T")


def _being_cancelled() -> bool:
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


class AsyncClient:
    """The asyncio twin of :class:`snowkeep_client.Client`: the same settings,
    checks, retry rule and errors, with ``async`` calls.

    Cancellation is the task's: cancelling a task that awaits a call ends
    the call at once with :class:`asyncio.CancelledError`, never retried
    (``asyncio.timeout`` works so too, raising :class:`TimeoutError`).
    Building it makes no call; channels open on first use, inside the running
    event loop. Use ``async with`` or ``await client.close()``.
    """

    def __init__(
        self,
        endpoints: Sequence[str] | str,
        *,
        api_key: str | None = None,
        tls: Tls | None = None,
        request_timeout: float = 5.0,
        retry_budget: float = 10.0,
        backoff: float = 0.02,
        max_backoff: float = 1.0,
    ) -> None:
        self._settings = build_settings(
            endpoints,
            api_key=api_key,
            tls=tls,
            request_timeout=request_timeout,
            retry_budget=retry_budget,
            backoff=backoff,
            max_backoff=max_backoff,
        )
        s = self._settings
        self._endpoints = Endpoints(len(s.endpoints), s.backoff, s.max_backoff, time.monotonic)
        self._channels: list[grpc.aio.Channel | None] = [None] * len(s.endpoints)
        self._closed = False
        self._layout: Layout | None = None

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        """Closes the connections; calls in flight end, later calls raise
        ``FAILED_PRECONDITION`` "client closed". Idempotent."""
        self._closed = True
        channels, self._channels = self._channels, [None] * len(self._channels)
        for ch in channels:
            if ch is not None:
                await ch.close()

    @property
    def closed(self) -> bool:
        """True after :meth:`close`."""
        return self._closed

    def _channel(self, i: int) -> grpc.aio.Channel:
        if self._closed:
            raise client_closed()
        ch = self._channels[i]
        if ch is None:
            e, s = self._settings.endpoints[i], self._settings
            if e.tls:
                assert s.credentials is not None
                ch = grpc.aio.secure_channel(e.target, s.credentials, s.channel_options)
            else:
                ch = grpc.aio.insecure_channel(e.target, s.channel_options)
            self._channels[i] = ch
        return ch

    def _attempts(self, timeout: float | None) -> Attempts:
        s = self._settings
        return Attempts(
            self._endpoints,
            request_timeout=s.request_timeout,
            retry_budget=s.retry_budget,
            backoff=s.backoff,
            max_backoff=s.max_backoff,
            caller_timeout=timeout,
        )

    def _metadata(self) -> tuple[tuple[str, str], ...] | None:
        return self._settings.metadata or None

    async def _run(
        self, op: Callable[[grpc.aio.Channel, float], Awaitable[T]], timeout: float | None
    ) -> T:
        """Runs ``op`` under the retry rule; a task cancel propagates at once."""
        attempts = self._attempts(check_timeout(timeout))
        while True:
            try:
                attempt = attempts.start()
                try:
                    result = await op(self._channel(attempt.endpoint), attempt.timeout)
                except (grpc.aio.AioRpcError, SnowkeepError) as e:
                    if self._closed:
                        raise client_closed() from None
                    err = e if isinstance(e, SnowkeepError) else from_rpc_error(e)
                    delay = attempts.failed(attempt, err)
                    if delay > 0:
                        await asyncio.sleep(delay)
                    continue
                except asyncio.CancelledError:
                    if self._closed and not _being_cancelled():
                        raise client_closed() from None
                    raise
            except CallerDeadline:
                raise TimeoutError(f"the call's timeout of {timeout} s passed") from None
            attempts.succeeded(attempt)
            return result

    async def next_ids(self, count: int, *, timeout: float | None = None) -> list[int]:
        """``count`` ids (1 to 100,000), strictly ascending, from one server.

        Errors as :meth:`snowkeep_client.Client.next_ids`; a task cancel
        raises :class:`asyncio.CancelledError` at once.
        """
        check_count(count)
        request = id_pb2.NextIdsRequest(count=count)
        md = self._metadata()

        async def op(ch: grpc.aio.Channel, deadline: float) -> list[int]:
            stub = id_pb2_grpc.IdServiceStub(ch)
            response = await stub.NextIds(request, timeout=deadline, metadata=md)
            return list(response.ids)

        return await self._run(op, timeout)

    def stream(self, total: int, batch_size: int = 0) -> AsyncIdStream:
        """Exactly ``total`` ids as an async iterator of batches; see
        :class:`AsyncIdStream` and :meth:`snowkeep_client.Client.stream`."""
        check_stream(total, batch_size)
        if self._closed:
            raise client_closed()
        return AsyncIdStream(self, total, batch_size)

    def pool(
        self, batch: int = 100, low_water: int | None = None, max_age: float = 600.0
    ) -> AsyncPool:
        """A prefetching :class:`AsyncPool`; call it inside a running loop."""
        from ._aio_pool import AsyncPool

        return AsyncPool(self, batch=batch, low_water=low_water, max_age=max_age)

    async def layout(self, *, timeout: float | None = None) -> Layout:
        """The layout the servers report (``GetInfo``), read once and cached."""
        if self._layout is not None:
            return self._layout
        md = self._metadata()

        async def op(ch: grpc.aio.Channel, deadline: float) -> Layout:
            stub = info_pb2_grpc.InfoServiceStub(ch)
            info = await stub.GetInfo(info_pb2.GetInfoRequest(), timeout=deadline, metadata=md)
            return layout_of(info, md is not None)

        self._layout = await self._run(op, timeout)
        return self._layout

    async def decode(self, id: int, *, timeout: float | None = None) -> DecodedId:
        """The parts of ``id``; ``INVALID_ARGUMENT`` naming ``id`` when it is
        above the layout's largest id (or not an int from 0)."""
        if isinstance(id, bool) or not isinstance(id, int) or id < 0:
            raise invalid_argument(f"id: {id!r} is not an id (an int of at most 63 bits)")
        return (await self.layout(timeout=timeout)).decode(id)


class AsyncIdStream(AsyncIterator[list[int]]):
    """An async iterator of batches holding exactly ``total`` ids, with the
    guarantee and resumption of :class:`snowkeep_client.IdStream`.

    Cancelling the task that iterates cancels the stream's call (never
    retried). ``await stream.aclose()`` (or ``async with``) ends it early.
    """

    def __init__(self, client: AsyncClient, total: int, batch_size: int) -> None:
        self._client = client
        #: Ids asked for.
        self.total = total
        #: Ids delivered so far.
        self.received = 0
        self._batch_size = batch_size
        self._attempts = client._attempts(None)
        self._call: grpc.aio.UnaryStreamCall[id_pb2.StreamIdsRequest, id_pb2.IdBatch] | None
        self._call = None
        self._attempt: Attempt | None = None
        self._first = False
        self._done = False

    def __aiter__(self) -> AsyncIdStream:
        return self

    async def __aenter__(self) -> AsyncIdStream:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Cancels the stream; the iteration stops. Idempotent."""
        self._done = True
        self._drop_call()

    def _drop_call(self) -> None:
        call, self._call = self._call, None
        if call is not None:
            call.cancel()

    def _open(self) -> grpc.aio.UnaryStreamCall[id_pb2.StreamIdsRequest, id_pb2.IdBatch]:
        attempt = self._attempts.start()
        self._attempt, self._first = attempt, False
        stub = id_pb2_grpc.IdServiceStub(self._client._channel(attempt.endpoint))
        request = id_pb2.StreamIdsRequest(
            total=self.total - self.received, batch_size=self._batch_size
        )
        self._call = stub.StreamIds(request, metadata=self._client._metadata())
        return self._call

    async def _read(
        self, call: grpc.aio.UnaryStreamCall[id_pb2.StreamIdsRequest, id_pb2.IdBatch]
    ) -> list[int] | SnowkeepError:
        assert self._attempt is not None
        # Each wait is bounded: the attempt's deadline for the first batch,
        # then request_timeout within the budget each batch restarts.
        wait = self._attempts.batch_wait() if self._first else self._attempt.timeout
        try:
            batch = await asyncio.wait_for(call.read(), wait)
        except TimeoutError:
            return SnowkeepError(
                grpc.StatusCode.DEADLINE_EXCEEDED, "no batch within the request timeout"
            )
        except grpc.aio.AioRpcError as e:
            return from_rpc_error(e)
        if not isinstance(batch, id_pb2.IdBatch):  # grpc.aio.EOF: ended with OK
            return SnowkeepError(
                grpc.StatusCode.UNAVAILABLE,
                f"the server ended the stream with OK after {self.received} of {self.total} ids",
            )
        if not self._first:
            self._first = True
            self._attempts.succeeded(self._attempt)
        self._attempts.restart()
        ids = list(batch.ids)
        left = self.total - self.received
        return ids if len(ids) <= left else ids[:left]

    async def __anext__(self) -> list[int]:
        try:
            while not self._done and self.received < self.total:
                got = await self._read(self._open() if self._call is None else self._call)
                if isinstance(got, list):
                    if got:
                        self.received += len(got)
                        return got
                    continue
                self._drop_call()
                if self._done:
                    break
                if self._client.closed:
                    raise client_closed()
                assert self._attempt is not None
                delay = self._attempts.failed(self._attempt, got)
                if delay > 0:
                    await asyncio.sleep(delay)
        except asyncio.CancelledError:
            await self.aclose()
            if self._client.closed and not _being_cancelled():
                raise client_closed() from None
            raise
        except BaseException:
            await self.aclose()
            raise
        await self.aclose()
        raise StopAsyncIteration
