"""pytest-benchmark of Pool.next() against a fake server on loopback."""

from __future__ import annotations

from snowkeep_client import Client


def test_pool_next(servers, benchmark) -> None:  # type: ignore[no-untyped-def]
    fake = servers()
    with Client([fake.target]) as client, client.pool(batch=100_000) as pool:
        first = pool.next()
        benchmark(pool.next)
        assert first == 1_000_001
        assert pool.next() > first
