"""The conformance driver of the Python client (conformance/README.md).

Reads one JSON request per line on stdin and answers each with JSON lines on
stdout: zero or more progress lines, then one line with "ok". Uses only the
public API of snowkeep_client (the blocking Client and Pool; AsyncClient for
the concurrent bench_unary). Ids are decimal strings.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Callable
from typing import Any

import grpc

from snowkeep_client import AsyncClient, Client, Pool, SnowkeepError, Tls

Answer = dict[str, Any]


class Failed(Exception):
    """An error answer with the ids delivered before it."""

    def __init__(self, error: BaseException, ids: list[int]) -> None:
        super().__init__(str(error))
        self.error = error
        self.ids = ids


def emit(obj: Answer) -> None:
    sys.stdout.write(json.dumps(obj, separators=(",", ":")) + "\n")
    sys.stdout.flush()


def error_answer(e: BaseException) -> Answer:
    if isinstance(e, SnowkeepError):
        return {"ok": False, "code": e.code_name, "message": e.message}
    if isinstance(e, TimeoutError):
        return {"ok": False, "code": "DEADLINE_EXCEEDED", "message": str(e)}
    return {"ok": False, "code": "UNKNOWN", "message": f"{type(e).__name__}: {e}"}


def strs(ids: list[int]) -> list[str]:
    return [str(i) for i in ids]


class Driver:
    """The state between requests: the open client, its settings, a pool."""

    def __init__(self) -> None:
        self.client: Client | None = None
        self.settings: dict[str, Any] = {}
        self.pool: Pool | None = None

    def need_client(self) -> Client:
        if self.client is None:
            raise SnowkeepError(grpc.StatusCode.FAILED_PRECONDITION, "client closed")
        return self.client

    def need_pool(self) -> Pool:
        if self.pool is None:
            raise SnowkeepError(grpc.StatusCode.FAILED_PRECONDITION, "pool closed")
        return self.pool

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()
        if self.client is not None:
            self.client.close()

    def op_open(self, req: Answer) -> Answer:
        self.close()
        self.client, self.pool = None, None
        tls = req.get("tls")

        def seconds(key: str, default_ms: float) -> float:
            value = req.get(key)
            return (default_ms if value is None else float(value)) / 1000.0

        self.settings = {
            "api_key": req.get("api_key"),
            "tls": None
            if tls is None
            else Tls(ca=tls.get("ca"), cert=tls.get("cert"), key=tls.get("key")),
            "request_timeout": seconds("request_timeout_ms", 5000),
            "retry_budget": seconds("retry_budget_ms", 10000),
            "backoff": seconds("backoff_ms", 20),
            "max_backoff": seconds("max_backoff_ms", 1000),
        }
        self.endpoints = list(req.get("endpoints") or [])
        self.client = Client(self.endpoints, **self.settings)
        return {"ok": True}

    def op_next_ids(self, req: Answer) -> Answer:
        return {
            "ok": True,
            "ids": strs(self.need_client().next_ids(req.get("count", 0))),
        }

    def op_stream(self, req: Answer) -> Answer:
        pace = float(req.get("pace_ms") or 0) / 1000.0
        every = int(req.get("progress_every") or 0)
        ids: list[int] = []
        batches = 0
        try:
            with self.need_client().stream(req.get("total", 0), req.get("batch_size", 0)) as stream:
                for batch in stream:
                    ids.extend(batch)
                    batches += 1
                    if every and batches % every == 0:
                        emit(
                            {
                                "progress": {
                                    "received": len(ids),
                                    "last_id": str(ids[-1]),
                                }
                            }
                        )
                    if pace:
                        time.sleep(pace)
        except Exception as e:
            raise Failed(e, ids) from e
        return {"ok": True, "ids": strs(ids)}

    def op_pool_open(self, req: Answer) -> Answer:
        if self.pool is not None:
            self.pool.close()
        self.pool = None
        max_age_ms = req.get("max_age_ms")
        self.pool = self.need_client().pool(
            batch=100 if req.get("batch") is None else req["batch"],
            low_water=req.get("low_water"),
            max_age=600.0 if max_age_ms is None else float(max_age_ms) / 1000.0,
        )
        return {"ok": True}

    def op_pool_take(self, req: Answer) -> Answer:
        ids: list[int] = []
        try:
            pool = self.need_pool()
            for _ in range(int(req.get("count", 0))):
                ids.append(pool.next())
        except Exception as e:
            raise Failed(e, ids) from e
        return {"ok": True, "ids": strs(ids)}

    def op_pool_close(self, req: Answer) -> Answer:
        if self.pool is not None:
            self.pool.close()
        return {"ok": True}

    def op_decode(self, req: Answer) -> Answer:
        raw = req.get("id")
        try:
            id = int(str(raw), 10)
        except ValueError:
            raise SnowkeepError(
                grpc.StatusCode.INVALID_ARGUMENT, f"id: {raw!r} is not a decimal id"
            ) from None
        d = self.need_client().decode(id)
        return {
            "ok": True,
            "unix_ms": d.unix_ms,
            "machine_id": d.machine_id,
            "sequence": d.sequence,
        }

    def op_bench_stream(self, req: Answer) -> Answer:
        client = self.need_client()
        start = time.perf_counter()
        count = 0
        with client.stream(req.get("total", 0), req.get("batch_size", 0)) as stream:
            for batch in stream:
                count += len(batch)
        return {"ok": True, "ids": count, "seconds": time.perf_counter() - start}

    def op_bench_unary(self, req: Answer) -> Answer:
        self.need_client()
        concurrency = max(1, int(req.get("concurrency") or 1))
        seconds = float(req.get("seconds") or 1)
        latencies = asyncio.run(self._bench_unary(concurrency, seconds))
        latencies.sort()

        def pct(p: float) -> float:
            if not latencies:
                return 0.0
            return latencies[min(len(latencies) - 1, int(p * len(latencies)))] * 1000.0

        return {
            "ok": True,
            "calls": len(latencies),
            "p50_ms": pct(0.50),
            "p99_ms": pct(0.99),
        }

    async def _bench_unary(self, concurrency: int, seconds: float) -> list[float]:
        latencies: list[float] = []
        async with AsyncClient(self.endpoints, **self.settings) as client:
            end = time.perf_counter() + seconds

            async def caller() -> None:
                while time.perf_counter() < end:
                    t = time.perf_counter()
                    await client.next_ids(1)
                    latencies.append(time.perf_counter() - t)

            await asyncio.gather(*(caller() for _ in range(concurrency)))
        return latencies

    def op_bench_pool(self, req: Answer) -> Answer:
        count = int(req.get("count") or 0)
        with self.need_client().pool(batch=100_000, low_water=50_000) as pool:
            pool.next()  # the first refill, not counted
            take = pool.next
            start = time.perf_counter_ns()
            for _ in range(count):
                take()
            elapsed = time.perf_counter_ns() - start
        return {
            "ok": True,
            "ids": count,
            "ns_per_id": elapsed / count if count else 0.0,
        }

    def op_close(self, req: Answer) -> Answer:
        self.close()
        self.client, self.pool = None, None
        return {"ok": True}

    def handle(self, line: str) -> Answer:
        try:
            req = json.loads(line)
            op = req.get("op")
            method: Callable[[Answer], Answer] | None = getattr(self, f"op_{op}", None)
            if not isinstance(op, str) or method is None:
                return {
                    "ok": False,
                    "code": "UNIMPLEMENTED",
                    "message": f"unknown op {op!r}",
                }
            return method(req)
        except Failed as f:
            return {**error_answer(f.error), "ids": strs(f.ids)}
        except Exception as e:
            return error_answer(e)


def main() -> int:
    driver = Driver()
    for line in sys.stdin:
        if line.strip():
            emit(driver.handle(line))
    driver.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
