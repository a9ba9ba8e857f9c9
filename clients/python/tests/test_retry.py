"""The retry rule as a plan (fake clock) and against fake servers."""

from __future__ import annotations

from collections.abc import Callable

import grpc
import pytest

from snowkeep_client import RETRYABLE_CODES, Client, SnowkeepError
from snowkeep_client._retry import Attempts, Endpoints

from fake import Servers, free_port

S = grpc.StatusCode

RETRYABLE = [
    S.UNAVAILABLE,
    S.DEADLINE_EXCEEDED,
    S.UNKNOWN,
    S.CANCELLED,
    S.RESOURCE_EXHAUSTED,
    S.ABORTED,
    S.INTERNAL,
    S.FAILED_PRECONDITION,
    S.NOT_FOUND,
]
FINAL = [
    S.INVALID_ARGUMENT,
    S.UNAUTHENTICATED,
    S.PERMISSION_DENIED,
    S.OUT_OF_RANGE,
    S.UNIMPLEMENTED,
    S.ALREADY_EXISTS,
    S.DATA_LOSS,
]


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_retryable_codes_are_exactly_the_nine() -> None:
    assert set(RETRYABLE_CODES) == set(RETRYABLE)
    assert len(RETRYABLE) + len(FINAL) + 1 == len(list(S))


def plan(n: int, clock: Clock, rng: float = 0.5, budget: float = 10.0) -> Attempts:
    endpoints = Endpoints(n, 0.02, 1.0, clock)
    return Attempts(
        endpoints,
        request_timeout=5.0,
        retry_budget=budget,
        backoff=0.02,
        max_backoff=1.0,
        clock=clock,
        rng=lambda: rng,
    )


def test_rounds_go_through_every_endpoint_then_back_off_doubling_to_the_cap() -> None:
    clock = Clock()
    attempts = plan(3, clock, budget=100.0)
    err = SnowkeepError(S.UNAVAILABLE, "down")
    order: list[int] = []
    sleeps: list[float] = []
    for _ in range(24):
        a = attempts.start()
        order.append(a.endpoint)
        delay = attempts.failed(a, err)
        if delay:
            sleeps.append(round(delay, 9))
            clock.now += delay
    assert order[:6] == [0, 1, 2, 0, 1, 2]
    assert sleeps == [0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.0, 1.0]


def test_jitter_scales_each_sleep_by_0_8_to_1_2() -> None:
    for rng, want in [(0.0, 0.016), (1.0, 0.024)]:
        clock = Clock()
        attempts = plan(1, clock, rng=rng)
        a = attempts.start()
        assert round(attempts.failed(a, SnowkeepError(S.UNAVAILABLE, "x")), 9) == want


def test_the_budget_bounds_attempts_sleeps_and_deadlines() -> None:
    clock = Clock()
    attempts = plan(1, clock, budget=0.03)
    a = attempts.start()
    assert round(a.timeout, 9) == 0.03
    clock.now += 0.025
    delay = attempts.failed(a, SnowkeepError(S.UNAVAILABLE, "first"))
    assert round(delay, 9) == 0.005  # the sleep ends with the budget
    clock.now += delay
    with pytest.raises(SnowkeepError) as e:
        attempts.start()
    assert (e.value.code, e.value.message) == (S.UNAVAILABLE, "first")


def test_an_attempt_the_budget_cuts_short_keeps_the_failure_before_it() -> None:
    clock = Clock()
    attempts = plan(1, clock, budget=1.0)  # below request_timeout (5 s): every attempt is cut
    a = attempts.start()
    assert (a.budget_bound, round(a.timeout, 9)) == (True, 1.0)
    clock.now += 0.1
    clock.now += attempts.failed(a, SnowkeepError(S.UNAVAILABLE, "first"))
    b = attempts.start()
    assert b.budget_bound
    clock.now += b.timeout
    with pytest.raises(SnowkeepError) as e:
        attempts.failed(b, SnowkeepError(S.DEADLINE_EXCEEDED, "no answer"))
    assert (e.value.code, e.value.message) == (S.UNAVAILABLE, "first")


def test_a_batch_forgets_the_failures_before_it() -> None:
    clock = Clock()
    attempts = plan(1, clock, budget=1.0)
    a = attempts.start()
    clock.now += attempts.failed(a, SnowkeepError(S.UNAVAILABLE, "first"))
    attempts.start()
    attempts.restart()  # a batch arrived
    b = attempts.start()
    clock.now += b.timeout
    with pytest.raises(SnowkeepError) as e:
        attempts.failed(b, SnowkeepError(S.DEADLINE_EXCEEDED, "stalled"))
    assert (e.value.code, e.value.message) == (S.DEADLINE_EXCEEDED, "stalled")


def test_an_attempt_request_timeout_bounds_reports_its_own_deadline() -> None:
    clock = Clock()
    attempts = plan(1, clock, budget=6.0)
    a = attempts.start()
    assert (a.budget_bound, round(a.timeout, 9)) == (False, 5.0)
    attempts.failed(a, SnowkeepError(S.UNAVAILABLE, "first"))
    clock.now += 1.0
    b = attempts.start()  # 5 s left: request_timeout bounds it, not the budget
    assert (b.budget_bound, round(b.timeout, 9)) == (False, 5.0)
    clock.now += b.timeout
    with pytest.raises(SnowkeepError) as e:
        attempts.failed(b, SnowkeepError(S.DEADLINE_EXCEEDED, "no answer"))
    assert (e.value.code, e.value.message) == (S.DEADLINE_EXCEEDED, "no answer")


def test_ejection_doubles_and_clears_on_success() -> None:
    clock = Clock()
    endpoints = Endpoints(2, 0.02, 0.05, clock)
    endpoints.failed(0)
    assert endpoints.ejected() == [True, False]
    assert [endpoints.pick(), endpoints.pick()] == [1, 1]
    clock.now += 0.02
    assert endpoints.ejected() == [False, False]
    endpoints.failed(0)
    clock.now += 0.039
    assert endpoints.ejected() == [True, False]
    endpoints.failed(0)  # third failure: 0.08, capped at 0.05
    endpoints.failed(1)
    clock.now += 0.021
    assert endpoints.ejected() == [True, False]
    assert endpoints.pick() == 1
    endpoints.failed(1)  # both ejected: the one whose ejection ends first
    assert endpoints.pick() == 0
    endpoints.succeeded(0)
    assert endpoints.ejected() == [False, True]


@pytest.mark.parametrize("code", RETRYABLE)
def test_a_retryable_failure_moves_to_the_next_server(servers: Servers, code: S) -> None:
    bad = servers([("fail", code, "try elsewhere")])
    good = servers()
    with Client([bad.target, good.target], backoff=5.0, max_backoff=5.0) as client:
        assert client.next_ids(3) == [2_000_001, 2_000_002, 2_000_003]
        # The failed server is ejected: the next call goes to the good one too.
        assert client.next_ids(2) == [2_000_004, 2_000_005]
    assert [c.count for c in bad.methods("NextIds")] == [3]
    assert [c.count for c in good.methods("NextIds")] == [3, 2]


@pytest.mark.parametrize("code", FINAL)
def test_a_final_failure_surfaces_after_one_attempt(servers: Servers, code: S) -> None:
    bad = servers([("fail", code, "no way")])
    good = servers()
    with Client([bad.target, good.target]) as client, pytest.raises(SnowkeepError) as e:
        client.next_ids(3)
    assert (e.value.code, e.value.message) == (code, "no way")
    assert len(bad.calls) == 1 and good.calls == []


def test_a_spent_budget_fails_with_the_last_error(servers: Servers) -> None:
    a = servers([("fail", S.UNAVAILABLE, "a is down")])
    b = servers([("fail", S.RESOURCE_EXHAUSTED, "b is busy")])
    with (
        Client([a.target, b.target], retry_budget=0.3, backoff=0.01, max_backoff=0.05) as client,
        pytest.raises(SnowkeepError) as e,
    ):
        client.next_ids(1)
    assert e.value.code in (S.UNAVAILABLE, S.RESOURCE_EXHAUSTED)
    assert (
        e.value.message
        == {S.UNAVAILABLE: "a is down", S.RESOURCE_EXHAUSTED: "b is busy"}[e.value.code]
    )
    assert len(a.calls) >= 2 and len(b.calls) >= 2


def test_an_attempt_the_budget_cuts_short_reports_the_failure_before_it(
    servers: Servers,
) -> None:
    fake = servers([("fail", S.UNAVAILABLE, "a is down"), ("hang",)])
    with (
        Client([fake.target], request_timeout=60.0, retry_budget=0.3, backoff=0.01) as client,
        pytest.raises(SnowkeepError) as e,
    ):
        client.next_ids(1)
    assert (e.value.code, e.value.message) == (S.UNAVAILABLE, "a is down")
    assert len(fake.calls) == 2


def test_a_refused_connection_is_unavailable_and_fails_over(servers: Servers) -> None:

    good = servers()
    dead = f"127.0.0.1:{free_port()}"
    with Client([dead, good.target]) as client:
        assert client.next_ids(2) == [1_000_001, 1_000_002]
    with Client([dead], retry_budget=0.2) as client, pytest.raises(SnowkeepError) as e:
        client.next_ids(2)
    assert e.value.code == S.UNAVAILABLE


def test_an_attempt_deadline_moves_to_the_next_server(servers: Servers) -> None:
    slow = servers([("hang",)])
    good = servers()
    with Client([slow.target, good.target], request_timeout=0.2) as client:
        assert client.next_ids(1) == [2_000_001]
    assert len(slow.calls) == 1


def test_the_callers_timeout_is_a_timeout_error_never_retried(servers: Servers) -> None:
    slow = servers([("hang",)])
    other = servers([("hang",)])
    with Client([slow.target, other.target]) as client, pytest.raises(TimeoutError):
        client.next_ids(1, timeout=0.2)
    assert len(slow.calls) + len(other.calls) == 1


def test_the_api_key_is_sent_as_a_bearer_token(servers: Servers) -> None:
    fake = servers()
    with Client([f"http://{fake.target}"], api_key="sk_test-123") as client:
        client.next_ids(1)
        list(client.stream(3))
        client.decode(1)
    assert [c.authorization for c in fake.calls] == ["Bearer sk_test-123"] * 3
    with Client([fake.target]) as client:
        client.next_ids(1)
    assert fake.calls[-1].authorization is None


def test_calls_after_close_fail_with_client_closed(servers: Servers) -> None:
    fake = servers()
    client = Client([fake.target])
    client.close()
    calls: list[Callable[[], object]] = [
        lambda: client.next_ids(1),
        lambda: client.stream(1),
        lambda: client.decode(1),
    ]
    for call in calls:
        with pytest.raises(SnowkeepError) as e:
            call()
        assert (e.value.code, e.value.message, e.value.retryable) == (
            S.FAILED_PRECONDITION,
            "client closed",
            False,
        )
    assert fake.calls == []
