"""An in-process double of snowkeep.v1 IdService/InfoService on loopback.

Each server answers from a script: a list of steps consumed one per call
(the last step repeats). Steps:

- ``"ok"``: NextIds answers ``count`` ids from the server's counter; StreamIds
  streams every id asked for.
- ``("fail", code, message)``: the call ends with that status at once.
- ``("hang",)``: the call waits until the client ends it (cancel/deadline).
- ``("part", batches, code, message)``: StreamIds sends ``batches`` batches,
  then ends with the status.
- ``("part-hang", batches)``: StreamIds sends ``batches`` batches, then
  waits until the client ends it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from concurrent import futures
from dataclasses import dataclass, field
from typing import Any

import grpc

from snowkeep_client._gen.snowkeep.v1 import id_pb2, id_pb2_grpc, info_pb2, info_pb2_grpc

Step = Any


@dataclass
class Seen:
    """What one call carried."""

    method: str
    count: int = 0
    total: int = 0
    batch_size: int = 0
    authorization: str | None = None


@dataclass
class FakeServer:
    """One fake snowkeep server; ``first_id`` is its first id."""

    first_id: int
    steps: list[Step] = field(default_factory=lambda: ["ok"])
    info_steps: list[Step] = field(default_factory=lambda: ["ok"])
    layout: info_pb2.Layout | None = field(
        default_factory=lambda: info_pb2.Layout(
            timestamp_bits=41, machine_bits=10, sequence_bits=12, epoch_unix_ms=1_700_000_000_000
        )
    )
    calls: list[Seen] = field(default_factory=list)
    port: int = 0

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._next = self.first_id
        self._server: grpc.Server | None = None
        self.hanging = threading.Semaphore(0)  # released when a call starts to hang

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _step(self, steps: list[Step]) -> Step:
        with self._lock:
            return steps.pop(0) if len(steps) > 1 else steps[0]

    def _record(self, seen: Seen, context: grpc.ServicerContext) -> None:
        for key, value in context.invocation_metadata():
            if key == "authorization":
                seen.authorization = str(value)
        with self._lock:
            self.calls.append(seen)

    def take(self, n: int) -> list[int]:
        with self._lock:
            ids = list(range(self._next, self._next + n))
            self._next += n
            return ids

    def _hang(self, context: grpc.ServicerContext) -> None:
        done = threading.Event()
        context.add_callback(done.set)
        self.hanging.release()
        done.wait()

    def next_ids(self, request: Any, context: grpc.ServicerContext) -> Any:
        self._record(Seen("NextIds", count=request.count), context)
        step = self._step(self.steps)
        if step == "ok":
            return id_pb2.NextIdsResponse(ids=self.take(request.count))
        if step[0] == "hang":
            self._hang(context)
            return id_pb2.NextIdsResponse()
        context.abort(step[1], step[2])

    def stream_ids(self, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        seen = Seen("StreamIds", total=request.total, batch_size=request.batch_size)
        self._record(seen, context)
        step = self._step(self.steps)
        size = request.batch_size or 1000
        if step == "ok":
            left = request.total
            while left > 0:
                n = min(size, left)
                left -= n
                yield id_pb2.IdBatch(ids=self.take(n))
            return
        if step[0] == "hang":
            self._hang(context)
            return
        if step[0] == "part":
            for _ in range(step[1]):
                yield id_pb2.IdBatch(ids=self.take(size))
            context.abort(step[2], step[3])
        if step[0] == "part-hang":
            for _ in range(step[1]):
                yield id_pb2.IdBatch(ids=self.take(size))
            self._hang(context)
            return
        context.abort(step[1], step[2])

    def get_info(self, request: Any, context: grpc.ServicerContext) -> Any:
        self._record(Seen("GetInfo"), context)
        step = self._step(self.info_steps)
        if step != "ok":
            context.abort(step[1], step[2])
        return info_pb2.GetInfoResponse(version="0.0.0-fake", layout=self.layout)

    def start(self) -> FakeServer:
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=16))
        fake = self

        class Ids(id_pb2_grpc.IdServiceServicer):
            def NextIds(self, request: Any, context: Any) -> Any:  # noqa: N802
                return fake.next_ids(request, context)

            def StreamIds(self, request: Any, context: Any) -> Any:  # noqa: N802
                return fake.stream_ids(request, context)

        class Info(info_pb2_grpc.InfoServiceServicer):
            def GetInfo(self, request: Any, context: Any) -> Any:  # noqa: N802
                return fake.get_info(request, context)

            def DecodeId(self, request: Any, context: Any) -> Any:  # noqa: N802
                context.abort(grpc.StatusCode.UNIMPLEMENTED, "not in the fake")

            def GetCapacity(self, request: Any, context: Any) -> Any:  # noqa: N802
                context.abort(grpc.StatusCode.UNIMPLEMENTED, "not in the fake")

        id_pb2_grpc.add_IdServiceServicer_to_server(Ids(), server)
        info_pb2_grpc.add_InfoServiceServicer_to_server(Info(), server)
        self.port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        self._server = server
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop(grace=None).wait()

    def methods(self, name: str) -> list[Seen]:
        with self._lock:
            return [c for c in self.calls if c.method == name]


def free_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


#: The ``servers`` fixture: starts a :class:`FakeServer` (steps, then fields).
Servers = Callable[..., FakeServer]
