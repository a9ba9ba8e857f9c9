"""The asyncio client: the same rule, and cancellation by task cancel."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from snowkeep_client import AsyncClient, DecodedId, SnowkeepError

from fake import Servers, free_port

S = grpc.StatusCode


@pytest.mark.asyncio
async def test_next_ids_fails_over_and_surfaces_final_codes(servers: Servers) -> None:
    bad = servers([("fail", S.UNAVAILABLE, "down"), ("fail", S.PERMISSION_DENIED, "denied")])
    good = servers()
    async with AsyncClient([bad.target, good.target], backoff=5.0, max_backoff=5.0) as client:
        assert await client.next_ids(2) == [2_000_001, 2_000_002]
    async with AsyncClient([bad.target]) as client:
        with pytest.raises(SnowkeepError) as e:
            await client.next_ids(2)
    assert (e.value.code, e.value.message) == (S.PERMISSION_DENIED, "denied")
    assert len(bad.calls) == 2


@pytest.mark.asyncio
async def test_a_task_cancel_ends_the_call_at_once_never_retried(servers: Servers) -> None:
    a = servers([("hang",)])
    b = servers([("hang",)])
    async with AsyncClient([a.target, b.target]) as client:
        task = asyncio.create_task(client.next_ids(1))
        assert await asyncio.to_thread(lambda: a.hanging.acquire(timeout=10))
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert len(a.calls) + len(b.calls) == 1


@pytest.mark.asyncio
async def test_asyncio_timeout_is_a_timeout_error(servers: Servers) -> None:
    a = servers([("hang",)])
    async with AsyncClient([a.target]) as client:
        with pytest.raises(TimeoutError):
            await client.next_ids(1, timeout=0.2)
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.2):
                await client.next_ids(1)
    assert len(a.calls) == 2


@pytest.mark.asyncio
async def test_the_async_stream_resumes_with_exactly_total(servers: Servers) -> None:
    a = servers([("part", 2, S.UNAVAILABLE, "killed"), "ok"])
    b = servers()
    async with AsyncClient([a.target, b.target]) as client:
        ids = [i async for batch in client.stream(35, 10) for i in batch]
    assert ids == list(range(1_000_001, 1_000_021)) + list(range(2_000_001, 2_000_016))
    assert [c.total for c in b.calls] == [15]


@pytest.mark.asyncio
async def test_the_async_stream_surfaces_a_final_end_after_its_batches(servers: Servers) -> None:
    fake = servers([("part", 1, S.INVALID_ARGUMENT, "bad")])
    got: list[int] = []
    async with AsyncClient([fake.target]) as client:
        with pytest.raises(SnowkeepError) as e:
            async for batch in client.stream(30, 10):
                got.extend(batch)
    assert e.value.code == S.INVALID_ARGUMENT and got == list(range(1_000_001, 1_000_011))


@pytest.mark.asyncio
async def test_cancelling_a_task_iterating_a_stream_cancels_it(servers: Servers) -> None:
    fake = servers([("hang",)])
    async with AsyncClient([fake.target]) as client:
        stream = client.stream(10)

        async def drain() -> list[list[int]]:
            return [b async for b in stream]

        task = asyncio.create_task(drain())
        assert await asyncio.to_thread(lambda: fake.hanging.acquire(timeout=10))
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert len(fake.calls) == 1


@pytest.mark.asyncio
async def test_the_async_pool_prefetches_fails_and_closes(servers: Servers) -> None:
    fake = servers()
    async with AsyncClient([fake.target], retry_budget=0.1, backoff=0.01) as client:
        async with client.pool(batch=10, low_water=2) as pool:
            assert [await pool.next() for _ in range(15)] == list(range(1_000_001, 1_000_016))
        with pytest.raises(SnowkeepError) as e:
            await pool.next()
        assert (e.value.code, e.value.message, e.value.retryable) == (
            S.FAILED_PRECONDITION,
            "pool closed",
            False,
        )
        fake.steps = [("fail", S.UNAVAILABLE, "no lease")]
        async with client.pool(batch=10) as pool:
            with pytest.raises(SnowkeepError) as e:
                while True:
                    await pool.next()
            assert (e.value.code, e.value.message) == (S.UNAVAILABLE, "no lease")


@pytest.mark.asyncio
async def test_async_decode_and_closed_client(servers: Servers) -> None:
    fake = servers()
    client = AsyncClient([fake.target])
    assert await client.decode((5 << 22) | (3 << 12) | 2) == DecodedId(1_700_000_000_005, 3, 2)
    await client.close()
    with pytest.raises(SnowkeepError) as e:
        await client.next_ids(1)
    assert (e.value.code, e.value.message, e.value.retryable) == (
        S.FAILED_PRECONDITION,
        "client closed",
        False,
    )


@pytest.mark.asyncio
async def test_an_async_stream_whose_first_batch_is_late_moves_on(servers: Servers) -> None:
    slow = servers([("hang",)])
    dead = f"127.0.0.1:{free_port()}"
    good = servers()
    async with AsyncClient([slow.target, dead, good.target], request_timeout=0.2) as client:
        ids = [i async for batch in client.stream(5) for i in batch]
    assert ids == list(range(2_000_001, 2_000_006))
    assert len(slow.calls) == 1


@pytest.mark.asyncio
async def test_an_async_attempt_the_budget_cuts_short_reports_the_failure_before_it(
    servers: Servers,
) -> None:
    fake = servers([("fail", S.UNAVAILABLE, "a is down"), ("hang",)])
    async with AsyncClient(
        [fake.target], request_timeout=60.0, retry_budget=0.3, backoff=0.01
    ) as client:
        with pytest.raises(SnowkeepError) as e:
            await client.next_ids(1)
    assert (e.value.code, e.value.message) == (S.UNAVAILABLE, "a is down")
    assert len(fake.calls) == 2


@pytest.mark.asyncio
async def test_an_async_resume_the_budget_cuts_short_reports_the_parts_end(
    servers: Servers,
) -> None:
    fake = servers([("part", 1, S.UNAVAILABLE, "gone"), ("hang",)])
    got: list[int] = []
    async with AsyncClient(
        [fake.target], request_timeout=60.0, retry_budget=0.3, backoff=0.01
    ) as client:
        with pytest.raises(SnowkeepError) as e:
            async for batch in client.stream(30, 10):
                got.extend(batch)
    assert (e.value.code, e.value.message) == (S.UNAVAILABLE, "gone")
    assert got == list(range(1_000_001, 1_000_011))
    assert len(fake.calls) == 2


@pytest.mark.asyncio
async def test_an_async_part_that_stalls_after_a_batch_is_resumed_after_the_request_timeout(
    servers: Servers,
) -> None:
    fake = servers([("part-hang", 1), "ok"])
    async with AsyncClient([fake.target], request_timeout=0.5) as client:
        got = [i async for batch in client.stream(30, 10) for i in batch]
    assert got == list(range(1_000_001, 1_000_031))
    assert [c.total for c in fake.methods("StreamIds")] == [30, 20]


@pytest.mark.asyncio
async def test_an_async_stream_with_its_budget_spent_fails_with_the_last_error(
    servers: Servers,
) -> None:
    fake = servers([("part", 1, S.UNAVAILABLE, "gone"), ("fail", S.RESOURCE_EXHAUSTED, "busy")])
    got: list[int] = []
    async with AsyncClient([fake.target], retry_budget=0.2, backoff=0.01) as client:
        with pytest.raises(SnowkeepError) as e:
            async for batch in client.stream(30, 10):
                got.extend(batch)
    assert (e.value.code, e.value.message) == (S.RESOURCE_EXHAUSTED, "busy")
    assert got == list(range(1_000_001, 1_000_011))
