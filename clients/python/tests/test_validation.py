"""Settings and arguments refused before any call, naming the parameter."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from snowkeep_client import Client, SnowkeepError, Tls

from fake import Servers

INVALID = grpc.StatusCode.INVALID_ARGUMENT


def refused(fn: object, *args: object, **kw: object) -> SnowkeepError:
    with pytest.raises(SnowkeepError) as e:
        fn(*args, **kw)  # type: ignore[operator]
    assert e.value.code == INVALID
    return e.value


@pytest.mark.parametrize(
    "endpoints",
    [
        [],
        [""],
        ["localhost"],
        ["localhost:0"],
        ["localhost:65536"],
        ["localhost:99999999"],
        ["ftp://localhost:1"],
        ["http://localhost"],
        ["http://localhost:1/path"],
        ["127.0.0.1:50051", "nope"],
        [" 127.0.0.1:50051"],
        ["127.0.0.1:50051\n"],
        ["local host:50051"],
    ],
)
def test_malformed_endpoints_are_refused_naming_endpoints(endpoints: list[str]) -> None:
    err = refused(Client, endpoints)
    assert err.message.startswith("endpoints: ")
    if endpoints and endpoints[-1]:
        assert repr(endpoints[-1]) in err.message


def test_good_endpoints_are_accepted() -> None:
    for e in ["127.0.0.1:1", "http://localhost:65535", "https://example.invalid:443", "[::1]:80"]:
        Client([e]).close()


@pytest.mark.parametrize("key", ["a b", "tab\tkey", "ключ", "", "new\nline"])
def test_bad_api_keys_are_refused_naming_api_key(key: str) -> None:
    err = refused(Client, ["127.0.0.1:1"], api_key=key)
    assert err.message.startswith("api_key: ")


def test_unreadable_tls_files_are_refused_naming_the_parameter(tmp_path: Path) -> None:
    pem = tmp_path / "x.pem"
    pem.write_text("not really a pem")
    missing = str(tmp_path / "missing.pem")
    err = refused(Client, ["https://h:1"], tls=Tls(ca=missing))
    assert err.message.startswith(f"tls.ca: cannot read {missing!r}")
    err = refused(Client, ["https://h:1"], tls=Tls(ca=str(pem), cert=missing, key=str(pem)))
    assert err.message.startswith(f"tls.cert: cannot read {missing!r}")
    err = refused(Client, ["https://h:1"], tls=Tls(ca=str(pem), cert=str(pem), key=missing))
    assert err.message.startswith(f"tls.key: cannot read {missing!r}")
    err = refused(Client, ["https://h:1"], tls=Tls(cert=str(pem)))
    assert err.message.startswith("tls.key: missing")
    err = refused(Client, ["https://h:1"], tls=Tls(key=str(pem)))
    assert err.message.startswith("tls.cert: missing")


def test_bad_counts_are_refused_before_any_call(servers: Servers) -> None:
    fake = servers()
    with Client([fake.target]) as client:
        for count in [0, 100_001, -1]:
            err = refused(client.next_ids, count)
            assert err.message == f"count: {count} is outside 1 to 100000"
        err = refused(client.stream, 0)
        assert err.message.startswith("total: 0 is outside 1 to 9223372036854775807")
        err = refused(client.stream, 10, 100_001)
        assert err.message.startswith("batch_size: 100001 is outside 0 to 100000")
        err = refused(client.pool, 0)
        assert err.message.startswith("batch: 0 is outside 1 to 100000")
        err = refused(client.pool, 100, 100)
        assert err.message.startswith("low_water: 100 is outside 0 to 99")
        err = refused(client.decode, -1)
        assert err.message.startswith("id: -1")
    assert fake.calls == []


def test_bad_times_are_refused_naming_them() -> None:
    for name in ["request_timeout", "retry_budget", "backoff", "max_backoff"]:
        err = refused(Client, ["127.0.0.1:1"], **{name: 0})
        assert err.message.startswith(f"{name}: 0 ")
    err = refused(Client, ["127.0.0.1:1"], backoff=2.0, max_backoff=1.0)
    assert err.message == "max_backoff: 1.0 is below backoff 2.0"
