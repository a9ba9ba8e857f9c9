#!/usr/bin/env python3
"""Calls a snowkeep server with snowkeep-client, blocking and asyncio.

From the repository root, after clients/python/ensure-deps and with a server
running (scripts/run starts one on 127.0.0.1:50051):

    target/py-client/bin/python clients/python/example.py 127.0.0.1:50051
"""

from __future__ import annotations

import asyncio
import sys

import grpc

from snowkeep_client import AsyncClient, Client, SnowkeepError


def blocking(endpoint: str) -> None:
    with Client([endpoint]) as client:
        ids = client.next_ids(5)  # five ascending ints
        print("next_ids:", ids)
        parts = client.decode(ids[0])
        print("decoded:", parts.unix_ms, parts.machine_id, parts.sequence)
        sizes = [len(batch) for batch in client.stream(2500, batch_size=1000)]
        print("stream batch sizes:", sizes)  # [1000, 1000, 500]
        with client.pool(batch=100) as pool:
            print("pool:", [pool.next() for _ in range(3)])
        try:
            client.next_ids(0)
        except SnowkeepError as e:
            assert e.code == grpc.StatusCode.INVALID_ARGUMENT
            print("refused:", e)


async def concurrent(endpoint: str) -> None:
    async with AsyncClient([endpoint]) as client:
        batches = await asyncio.gather(*(client.next_ids(2) for _ in range(3)))
        print("async next_ids:", batches)
        async with client.pool(batch=50) as pool:
            print("async pool:", await pool.next())


if __name__ == "__main__":
    target = sys.argv[1] if len(sys.argv) > 1 else "127.0.0.1:50051"
    blocking(target)
    asyncio.run(concurrent(target))
