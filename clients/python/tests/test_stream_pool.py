"""The resuming stream, the pool (sync) and decode, against fake servers."""

from __future__ import annotations

import threading
import time

import grpc
import pytest

from snowkeep_client import Client, DecodedId, SnowkeepError
from snowkeep_client._buffer import Buffer
from snowkeep_client._gen.snowkeep.v1 import info_pb2

from fake import FakeServer, Servers

S = grpc.StatusCode


def test_a_stream_delivers_exactly_total_in_batches(servers: Servers) -> None:
    fake = servers()
    with Client([fake.target]) as client:
        batches = list(client.stream(25, 10))
    assert [len(b) for b in batches] == [10, 10, 5]
    assert [i for b in batches for i in b] == list(range(1_000_001, 1_000_026))
    assert [(c.total, c.batch_size) for c in fake.calls] == [(25, 10)]


def test_a_stream_ended_early_resumes_the_rest_on_the_next_server(servers: Servers) -> None:
    a = servers([("part", 3, S.UNAVAILABLE, "shutting down"), "ok"])
    b = servers()
    with Client([a.target, b.target]) as client:
        stream = client.stream(50, 10)
        ids = [i for batch in stream for i in batch]
    assert ids == list(range(1_000_001, 1_000_031)) + list(range(2_000_001, 2_000_021))
    assert stream.received == 50
    assert [(c.total, c.batch_size) for c in a.calls] == [(50, 10)]
    assert [(c.total, c.batch_size) for c in b.calls] == [(20, 10)]


def test_a_final_end_surfaces_after_the_batches_delivered(servers: Servers) -> None:
    fake = servers([("part", 2, S.FAILED_PRECONDITION, "layout exhausted"), "ok"])
    fake.steps = [("part", 2, S.PERMISSION_DENIED, "no ids for you")]
    got: list[int] = []
    with Client([fake.target]) as client, pytest.raises(SnowkeepError) as e:
        for batch in client.stream(100, 10):
            got.extend(batch)
    assert (e.value.code, e.value.message) == (S.PERMISSION_DENIED, "no ids for you")
    assert got == list(range(1_000_001, 1_000_021))
    assert len(fake.calls) == 1


def test_a_stream_whose_first_batch_is_late_moves_on(servers: Servers) -> None:
    slow = servers([("hang",)])
    good = servers()
    with Client([slow.target, good.target], request_timeout=0.2) as client:
        ids = [i for b in client.stream(5) for i in b]
    assert ids == list(range(2_000_001, 2_000_006))


def test_a_stream_whose_budget_is_spent_fails_with_the_last_error(servers: Servers) -> None:
    fake = servers([("part", 1, S.UNAVAILABLE, "gone"), ("fail", S.UNAVAILABLE, "still gone")])
    got: list[int] = []
    with Client([fake.target], retry_budget=0.2, backoff=0.01) as client:
        with pytest.raises(SnowkeepError) as e:
            for batch in client.stream(30, 10):
                got.extend(batch)
    assert (e.value.code, e.value.message) == (S.UNAVAILABLE, "still gone")
    assert got == list(range(1_000_001, 1_000_011))
    assert all(c.total == 20 for c in fake.calls[1:])


def test_a_resume_the_budget_cuts_short_reports_the_parts_end(servers: Servers) -> None:
    fake = servers([("part", 1, S.UNAVAILABLE, "gone"), ("hang",)])
    got: list[int] = []
    with Client([fake.target], request_timeout=60.0, retry_budget=0.3, backoff=0.01) as client:
        with pytest.raises(SnowkeepError) as e:
            for batch in client.stream(30, 10):
                got.extend(batch)
    assert (e.value.code, e.value.message) == (S.UNAVAILABLE, "gone")
    assert got == list(range(1_000_001, 1_000_011))
    assert len(fake.calls) == 2


def test_a_part_that_stalls_after_a_batch_is_resumed_after_the_request_timeout(
    servers: Servers,
) -> None:
    fake = servers([("part-hang", 1), "ok"])
    with Client([fake.target], request_timeout=0.5) as client:
        got = [i for batch in client.stream(30, 10) for i in batch]
    assert got == list(range(1_000_001, 1_000_031))
    assert [c.total for c in fake.methods("StreamIds")] == [30, 20]


def test_a_slow_reader_is_not_timed_out_between_its_own_reads(servers: Servers) -> None:
    fake = servers()
    with Client([fake.target], request_timeout=0.3) as client:
        got: list[int] = []
        for batch in client.stream(30, 10):
            got.extend(batch)
            time.sleep(0.5)  # longer than request_timeout, but not a wait for a batch
    assert got == list(range(1_000_001, 1_000_031))
    assert [c.total for c in fake.methods("StreamIds")] == [30]


def test_closing_a_stream_stops_it(servers: Servers) -> None:
    fake = servers()
    with Client([fake.target]) as client:
        stream = client.stream(1000, 10)
        assert next(stream) == list(range(1_000_001, 1_000_011))
        stream.close()
        assert list(stream) == []


def test_the_pool_hands_out_prefetched_ids_and_refills_at_low_water(servers: Servers) -> None:
    fake = servers()
    with Client([fake.target]) as client, client.pool(batch=10, low_water=3) as pool:
        ids = [pool.next() for _ in range(25)]
    assert ids == list(range(1_000_001, 1_000_026))
    counts = [c.count for c in fake.calls]
    assert set(counts) == {10} and 3 <= len(counts) <= 4


def test_the_pool_fails_with_the_refills_last_error_and_recovers(servers: Servers) -> None:
    fake = servers([("fail", S.UNAVAILABLE, "no lease")])
    with Client([fake.target], retry_budget=0.1, backoff=0.01) as client:
        with client.pool(batch=5) as pool:
            with pytest.raises(SnowkeepError) as e:
                pool.next()
            assert (e.value.code, e.value.message) == (S.UNAVAILABLE, "no lease")
            fake.steps = ["ok"]
            assert pool.next() == 1_000_001


def test_a_closed_pool_refuses_and_close_cancels_a_hanging_refill(servers: Servers) -> None:
    fake = servers([("hang",)])
    with Client([fake.target]) as client:
        pool = client.pool(batch=5)
        assert fake.hanging.acquire(timeout=10)
        pool.close()
        assert not pool._thread.is_alive()
        with pytest.raises(SnowkeepError) as e:
            pool.next()
        assert (e.value.code, e.value.message, e.value.retryable) == (
            S.FAILED_PRECONDITION,
            "pool closed",
            False,
        )


def test_a_pool_next_waiting_on_another_thread_sees_the_close(servers: Servers) -> None:
    fake = servers([("hang",)])
    errors: list[SnowkeepError] = []
    with Client([fake.target]) as client:
        pool = client.pool(batch=5)

        def take() -> None:
            try:
                pool.next()
            except SnowkeepError as e:
                errors.append(e)

        t = threading.Thread(target=take)
        t.start()
        assert fake.hanging.acquire(timeout=10)
        pool.close()
        t.join()
    assert [e.message for e in errors] == ["pool closed"]


def test_the_buffer_drops_ids_older_than_max_age() -> None:
    buf = Buffer(max_age=10.0)
    buf.add([1, 2, 3], fetched_at=0.0)
    buf.add([4, 5], fetched_at=5.0)
    assert buf.take(1.0) == 1
    assert buf.count == 4
    assert buf.take(10.0) == 4  # 2 and 3 are 10 s old: dropped
    assert buf.count == 1
    buf.drop_expired(15.0)
    assert buf.count == 0
    assert buf.take(15.0) is None


def test_decode_reads_the_layout_once(servers: Servers) -> None:
    layout = info_pb2.Layout(
        timestamp_bits=41, machine_bits=10, sequence_bits=12, epoch_unix_ms=1_000
    )
    fake: FakeServer = servers(layout=layout)
    id = (123 << 22) | (7 << 12) | 9
    with Client([fake.target]) as client:
        assert client.decode(id) == DecodedId(unix_ms=1_123, machine_id=7, sequence=9)
        assert client.decode(2**63 - 1) == DecodedId(1_000 + 2**41 - 1, 1023, 4095)
        with pytest.raises(SnowkeepError) as e:
            client.decode(2**63)
        assert e.value.code == S.INVALID_ARGUMENT and e.value.message.startswith("id: ")
    assert len(fake.methods("GetInfo")) == 1


def test_decode_uses_the_time_unit(servers: Servers) -> None:
    layout = info_pb2.Layout(
        timestamp_bits=31, machine_bits=8, sequence_bits=14, epoch_unix_ms=5, time_unit_ms=10
    )
    fake = servers(layout=layout)
    with Client([fake.target]) as client:
        assert client.decode((3 << 22) | (2 << 14) | 1) == DecodedId(35, 2, 1)
        with pytest.raises(SnowkeepError) as e:
            client.decode(2**53)
        assert e.value.message.startswith("id: 9007199254740992 is outside 0 to 9007199254740991")


def test_a_layout_withheld_for_want_of_a_key_is_unauthenticated(servers: Servers) -> None:
    fake = servers(layout=None)
    with Client([fake.target]) as client, pytest.raises(SnowkeepError) as e:
        client.decode(1)
    assert e.value.code == S.UNAUTHENTICATED and "api_key" in e.value.message
    assert len(fake.methods("GetInfo")) == 1
    with (
        Client([fake.target], api_key="k.secret", retry_budget=0.1, backoff=0.01) as client,
        pytest.raises(SnowkeepError) as e,
    ):
        client.decode(1)
    assert e.value.code == S.UNAVAILABLE
    assert len(fake.methods("GetInfo")) > 2
