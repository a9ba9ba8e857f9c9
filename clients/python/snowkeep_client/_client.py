"""The synchronous client: :class:`Client` and its :class:`IdStream`."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

import grpc

from ._errors import SnowkeepError, client_closed, from_rpc_error, invalid_argument
from ._gen.snowkeep.v1 import id_pb2, id_pb2_grpc, info_pb2, info_pb2_grpc
from ._layout import DecodedId, Layout, layout_of
from ._options import Tls, build_settings, check_count, check_stream, check_timeout
from ._retry import Attempt, Attempts, CallerDeadline, Endpoints

if TYPE_CHECKING:
    from ._pool import Pool

__all__ = ["Client", "IdStream"]

T = TypeVar("T")
R = TypeVar("R")


class _Cancel:
    """Cancels a blocking call from another thread (a pool's close)."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self._lock = threading.Lock()
        self._future: grpc.Future[Any] | None = None

    def run(self, future: grpc.Future[R]) -> R:
        with self._lock:
            self._future = future
            if self.event.is_set():
                future.cancel()
        try:
            return future.result()
        finally:
            with self._lock:
                self._future = None

    def cancel(self) -> None:
        with self._lock:
            self.event.set()
            if self._future is not None:
                self._future.cancel()


def _timed_out(timeout: float | None) -> TimeoutError:
    return TimeoutError(f"the call's timeout of {timeout} s passed")


class Client:
    """A client of one or more snowkeep servers (blocking calls).

    ``endpoints``: ``host:port``, ``http://host:port`` or ``https://host:port``
    (``https``, or ``tls`` set with a bare ``host:port``, means TLS).
    ``api_key`` is sent as ``authorization: Bearer <key>`` on every call.
    ``tls``: a :class:`Tls` with a CA file and, for mTLS, a cert and key file.
    Times are in seconds: ``request_timeout`` bounds each attempt,
    ``retry_budget`` the whole call, ``backoff`` (doubling per round up to
    ``max_backoff``, ±20 % jitter) the sleep after every endpoint failed.

    Building a client makes no call (connections open lazily) but checks
    every setting: a bad one raises :class:`SnowkeepError`
    ``INVALID_ARGUMENT`` naming it (``endpoints``, ``api_key``, ``tls.ca``,
    ``tls.cert``, ``tls.key``, ...). Thread-safe; use it as a context manager
    or call :meth:`close`. Calls after close raise ``FAILED_PRECONDITION``
    "client closed".
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
        self._lock = threading.Lock()
        self._channels: list[grpc.Channel | None] = [None] * len(s.endpoints)
        self._closed = False
        self._layout: Layout | None = None

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Closes the connections; calls in flight end, later calls raise
        ``FAILED_PRECONDITION`` "client closed". Idempotent."""
        with self._lock:
            self._closed = True
            channels, self._channels = self._channels, [None] * len(self._channels)
        for ch in channels:
            if ch is not None:
                ch.close()

    @property
    def closed(self) -> bool:
        """True after :meth:`close`."""
        return self._closed

    def _channel(self, i: int) -> grpc.Channel:
        with self._lock:
            if self._closed:
                raise client_closed()
            ch = self._channels[i]
            if ch is None:
                e, s = self._settings.endpoints[i], self._settings
                if e.tls:
                    assert s.credentials is not None
                    ch = grpc.secure_channel(e.target, s.credentials, s.channel_options)
                else:
                    ch = grpc.insecure_channel(e.target, s.channel_options)
                # A sync channel with no call pending is polled only by
                # grpc-core's backup poller (every 5 s): a reconnect's
                # handshake would wait for it and miss its connect deadline.
                # A connectivity subscriber keeps grpcio's polling thread
                # (one wake-up per 0.2 s) driving the channel; close() ends it.
                ch.subscribe(lambda _state: None, try_to_connect=False)
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

    def _run(
        self,
        op: Callable[[grpc.Channel, float, _Cancel | None], T],
        timeout: float | None,
        cancel: _Cancel | None = None,
    ) -> T:
        """Runs ``op`` under the retry rule."""
        attempts = self._attempts(check_timeout(timeout))
        while True:
            try:
                attempt = attempts.start()
                try:
                    result = op(self._channel(attempt.endpoint), attempt.timeout, cancel)
                except (grpc.RpcError, grpc.FutureCancelledError, SnowkeepError) as e:
                    delay = self._failed(attempts, attempt, e, cancel)
                    if delay > 0:
                        self._sleep(delay, cancel)
                    continue
            except CallerDeadline:
                raise _timed_out(timeout) from None
            attempts.succeeded(attempt)
            return result

    @staticmethod
    def _sleep(delay: float, cancel: _Cancel | None) -> None:
        if cancel is None:
            time.sleep(delay)
        elif cancel.event.wait(delay):
            raise SnowkeepError(grpc.StatusCode.CANCELLED, "cancelled")

    def _failed(
        self, attempts: Attempts, attempt: Attempt, e: Exception, cancel: _Cancel | None
    ) -> float:
        if self._closed:
            raise client_closed() from None
        if cancel is not None and cancel.event.is_set():
            raise SnowkeepError(grpc.StatusCode.CANCELLED, "cancelled") from None
        if isinstance(e, SnowkeepError):
            return attempts.failed(attempt, e)
        if not isinstance(e, grpc.RpcError):
            raise e
        return attempts.failed(attempt, from_rpc_error(e))

    def _metadata(self) -> tuple[tuple[str, str], ...] | None:
        return self._settings.metadata or None

    def _next_ids(self, count: int, timeout: float | None, cancel: _Cancel | None) -> list[int]:
        check_count(count)
        request = id_pb2.NextIdsRequest(count=count)
        md = self._metadata()

        def op(ch: grpc.Channel, deadline: float, cancel: _Cancel | None) -> list[int]:
            stub = id_pb2_grpc.IdServiceStub(ch)
            if cancel is None:
                response = stub.NextIds(request, timeout=deadline, metadata=md)
            else:
                future = stub.NextIds.future(request, timeout=deadline, metadata=md)
                response = cancel.run(future)
            return list(response.ids)

        return self._run(op, timeout, cancel)

    def next_ids(self, count: int, *, timeout: float | None = None) -> list[int]:
        """``count`` ids (1 to 100,000), strictly ascending, from one server.

        ``timeout``: the caller's own limit in seconds for the whole call,
        retries included; when it passes, :class:`TimeoutError` is raised and
        nothing is retried. Raises :class:`SnowkeepError`: ``INVALID_ARGUMENT``
        naming ``count`` before any call when it is out of range, the
        server's code and message for a non-retryable failure, or the last
        retryable failure once the retry budget is spent.
        """
        return self._next_ids(count, timeout, None)

    def stream(self, total: int, batch_size: int = 0) -> IdStream:
        """Exactly ``total`` ids (1 to 2^63 - 1) as an iterator of batches of
        ``batch_size`` (1 to 100,000; 0: the server's default, 1000).

        A stream that a server ends early with a retryable code resumes on the
        next endpoint for the ids still missing (see :class:`IdStream`).
        ``INVALID_ARGUMENT`` naming ``total`` or ``batch_size`` is raised here,
        before any call; other errors while iterating.
        """
        check_stream(total, batch_size)
        if self._closed:
            raise client_closed()
        return IdStream(self, total, batch_size)

    def pool(self, batch: int = 100, low_water: int | None = None, max_age: float = 600.0) -> Pool:
        """A prefetching :class:`Pool` of ids on this client (see there)."""
        from ._pool import Pool

        return Pool(self, batch=batch, low_water=low_water, max_age=max_age)

    def layout(self, *, timeout: float | None = None) -> Layout:
        """The layout the servers report (``InfoService.GetInfo``), read once
        under the retry rule and cached."""
        if self._layout is not None:
            return self._layout
        md = self._metadata()

        def op(ch: grpc.Channel, deadline: float, cancel: _Cancel | None) -> Layout:
            stub = info_pb2_grpc.InfoServiceStub(ch)
            info = stub.GetInfo(info_pb2.GetInfoRequest(), timeout=deadline, metadata=md)
            return layout_of(info, md is not None)

        self._layout = self._run(op, timeout)
        return self._layout

    def decode(self, id: int, *, timeout: float | None = None) -> DecodedId:
        """The parts of ``id`` under the servers' layout (see :meth:`layout`).

        Raises ``INVALID_ARGUMENT`` naming ``id`` when it is not an int from 0
        to the layout's largest id.
        """
        if isinstance(id, bool) or not isinstance(id, int) or id < 0:
            raise invalid_argument(f"id: {id!r} is not an id (an int of at most 63 bits)")
        return self.layout(timeout=timeout).decode(id)


class IdStream(Iterator[list[int]]):
    """An iterator of batches (lists of ``int``) holding exactly ``total`` ids.

    The guarantee: every id is unique; ids ascend within each server's part of
    the stream (a resumed part, from another machine id, may start below the
    previous part's last id); on success exactly ``total`` ids are delivered,
    never more, never fewer. When a server ends the stream early with a
    retryable code, the rest (``total - received``) is asked of the next
    endpoint under the retry rule; the retry budget restarts whenever a batch
    arrives. A non-retryable end or a spent budget raises
    :class:`SnowkeepError` after the batches already delivered. Each wait
    for a batch lasts at most ``request_timeout`` (and no longer than the
    budget left); a part that sends nothing for that long counts as a
    retryable ``DEADLINE_EXCEEDED`` failure of its server. :meth:`close`
    (or leaving a ``with`` block) cancels it; the iteration then stops.
    """

    def __init__(self, client: Client, total: int, batch_size: int) -> None:
        self._client = client
        #: Ids asked for.
        self.total = total
        #: Ids delivered so far.
        self.received = 0
        self._batch_size = batch_size
        self._attempts = client._attempts(None)
        self._call: grpc._CallIterator[id_pb2.IdBatch] | None = None
        self._attempt: Attempt | None = None
        self._first = False
        self._watchdog: _Watchdog | None = None
        self._done = False

    def __iter__(self) -> IdStream:
        return self

    def __enter__(self) -> IdStream:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Cancels the stream; the iteration stops. Idempotent."""
        self._done = True
        self._drop_call()

    def _drop_call(self) -> None:
        if self._watchdog is not None:
            self._watchdog.stop()
        call, self._call = self._call, None
        if call is not None:
            call.cancel()

    def _open(self) -> grpc._CallIterator[id_pb2.IdBatch]:
        attempt = self._attempts.start()
        self._attempt = attempt
        stub = id_pb2_grpc.IdServiceStub(self._client._channel(attempt.endpoint))
        request = id_pb2.StreamIdsRequest(
            total=self.total - self.received, batch_size=self._batch_size
        )
        call = stub.StreamIds(request, metadata=self._client._metadata())
        self._call, self._first, self._watchdog = call, False, _Watchdog(call)
        return call

    def _read(self, call: Iterator[id_pb2.IdBatch]) -> list[int] | SnowkeepError:
        assert self._attempt is not None and self._watchdog is not None
        # Each wait is bounded: the attempt's deadline for the first batch,
        # then request_timeout within the budget each batch restarts.
        wait = self._attempts.batch_wait() if self._first else self._attempt.timeout
        self._watchdog.arm(wait)
        try:
            batch = next(call)
        except StopIteration:
            return SnowkeepError(
                grpc.StatusCode.UNAVAILABLE,
                f"the server ended the stream with OK after {self.received} of {self.total} ids",
            )
        except grpc.RpcError as e:
            if self._watchdog.expired:
                return SnowkeepError(
                    grpc.StatusCode.DEADLINE_EXCEEDED, "no batch within the request timeout"
                )
            return from_rpc_error(e)
        finally:
            self._watchdog.disarm()
        if not self._first:
            self._first = True
            self._attempts.succeeded(self._attempt)
        self._attempts.restart()
        ids = list(batch.ids)
        left = self.total - self.received
        return ids if len(ids) <= left else ids[:left]

    def __next__(self) -> list[int]:
        while not self._done:
            if self.received >= self.total:
                break
            try:
                call = self._open() if self._call is None else self._call
            except BaseException:
                self._done = True
                raise
            got = self._read(call)
            if isinstance(got, list):
                if got:
                    self.received += len(got)
                    return got
                continue
            self._drop_call()
            if self._done:
                break
            if self._client.closed:
                self._done = True
                raise client_closed()
            try:
                assert self._attempt is not None
                delay = self._attempts.failed(self._attempt, got)
            except BaseException:
                self._done = True
                raise
            if delay > 0:
                time.sleep(delay)
        self.close()
        raise StopIteration


class _Watchdog:
    """Cancels one stream part's call when a wait for its next batch lasts
    longer than the time :meth:`arm` gave it; one daemon thread per part,
    which sleeps while no wait is armed and ends with :meth:`stop`."""

    def __init__(self, call: Any) -> None:
        self._call = call
        self._cond = threading.Condition()
        self._deadline: float | None = None
        self._idle = False
        self._stopped = False
        #: True once a wait outlasted its time and the call was cancelled.
        self.expired = False
        threading.Thread(target=self._run, name="snowkeep-stream-watchdog", daemon=True).start()

    def arm(self, wait: float) -> None:
        """A wait for a batch starts; it may last ``wait`` seconds."""
        with self._cond:
            self._deadline = time.monotonic() + wait
            if self._idle:
                self._cond.notify()

    def disarm(self) -> None:
        """The wait ended (a batch, the call's end or its error)."""
        with self._cond:
            self._deadline = None

    def stop(self) -> None:
        """Ends the thread; the call is left as it is."""
        with self._cond:
            self._stopped = True
            self._cond.notify()

    def _run(self) -> None:
        with self._cond:
            while not self._stopped:
                if self._deadline is None:
                    self._idle = True
                    self._cond.wait()
                    self._idle = False
                    continue
                left = self._deadline - time.monotonic()
                if left > 0:
                    # A later arm only moves the deadline later: waking at
                    # this one re-reads it.
                    self._cond.wait(left)
                    continue
                self.expired = True
                self._stopped = True
        if self.expired:
            self._call.cancel()
