"""pytest-benchmark of Pool.next() against a fake server on loopback."""

from __future__ import annotations

from typing import Any

from snowkeep_client import Client

from fake import Servers


def test_pool_next(servers: Servers, benchmark: Any) -> None:
    fake = servers()
    with Client([fake.target]) as client, client.pool(batch=100_000) as pool:
        first = pool.next()
        benchmark(pool.next)
        assert first == 1_000_001
        assert pool.next() > first
