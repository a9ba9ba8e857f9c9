"""Client settings, validated when a client is built (before any call)."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

import grpc

from ._errors import invalid_argument

__all__ = ["MAX_COUNT", "MAX_TOTAL", "Endpoint", "Settings", "Tls"]

#: The most ids one ``next_ids`` call (and one stream batch) may ask for.
MAX_COUNT = 100_000
#: The most ids one stream may ask for: 2^63 - 1.
MAX_TOTAL = 2**63 - 1
#: Largest message the client accepts (a batch of 100,000 ids is ~900 KB).
MAX_MESSAGE_BYTES = 64 << 20

_ENDPOINT = re.compile(
    r"(?:(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*)://)?"
    r"(?P<host>\[[^\]\s]+\]|[^:/\[\]\s]+):(?P<port>[0-9]+)/?"
)


@dataclass(frozen=True)
class Tls:
    """TLS settings: PEM files, read when the client is built.

    ``ca``: the CA certificate(s) to trust instead of the system roots
    (``None``: the system roots). ``cert`` and ``key``: the client
    certificate and its private key for mTLS, both or neither. A file that
    cannot be read, or a certificate without its key (or the reverse), is
    refused with :class:`SnowkeepError` ``INVALID_ARGUMENT`` naming
    ``tls.ca``, ``tls.cert`` or ``tls.key``.
    """

    ca: str | None = None
    cert: str | None = None
    key: str | None = None


@dataclass(frozen=True)
class Endpoint:
    """One parsed endpoint: ``target`` is ``host:port`` for gRPC."""

    target: str
    tls: bool


@dataclass(frozen=True)
class Settings:
    """Everything a client is built from, checked once (internal)."""

    endpoints: tuple[Endpoint, ...]
    metadata: tuple[tuple[str, str], ...]
    credentials: grpc.ChannelCredentials | None
    request_timeout: float
    retry_budget: float
    backoff: float
    max_backoff: float

    @property
    def channel_options(self) -> list[tuple[str, int]]:
        """Options of every channel: our own retries, not gRPC's."""
        return [
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.enable_retries", 0),
            # One connection per endpoint, not shared with other clients.
            ("grpc.use_local_subchannel_pool", 1),
            # gRPC's own reconnect backoff (1 s growing to 120 s) would keep
            # failing calls fast long after a restarted server is back; the
            # contract's backoff and ejection pace reconnects instead.
            ("grpc.initial_reconnect_backoff_ms", max(1, int(self.backoff * 1000))),
            # grpc-core reads this one as the *minimum connect timeout*, not
            # as a backoff: at the 20 ms backoff a TLS handshake over a real
            # network, or a handshake whose answer waits for the next poll,
            # would be abandoned every time. One request timeout per attempt.
            ("grpc.min_reconnect_backoff_ms", max(1, int(self.request_timeout * 1000))),
            ("grpc.max_reconnect_backoff_ms", max(1, int(self.max_backoff * 1000))),
        ]


def parse_endpoint(value: object, has_tls: bool) -> Endpoint:
    """``host:port``, ``http://host:port`` or ``https://host:port``."""
    if not isinstance(value, str):
        raise invalid_argument(f"endpoints: {value!r} is not a string")
    m = _ENDPOINT.fullmatch(value)
    scheme = (m.group("scheme") or "").lower() if m else ""
    port = int(m.group("port")) if m and len(m.group("port")) <= 5 else 0
    if m is None or scheme not in ("", "http", "https") or not 1 <= port <= 65535:
        raise invalid_argument(
            f"endpoints: {value!r} is not host:port, http://host:port or https://host:port "
            "with a port from 1 to 65535"
        )
    tls = scheme == "https" or (scheme == "" and has_tls)
    return Endpoint(f"{m.group('host')}:{port}", tls)


def _read(param: str, path: str | None) -> bytes | None:
    if path is None:
        return None
    try:
        with open(path, "rb") as f:
            return f.read()
    except (OSError, TypeError, ValueError) as e:
        raise invalid_argument(f"{param}: cannot read {path!r}: {e}") from None


def credentials(tls: Tls | None) -> grpc.ChannelCredentials:
    """Channel credentials from ``tls`` (``None``: the system roots)."""
    if tls is None:
        return grpc.ssl_channel_credentials()
    if (tls.cert is None) != (tls.key is None):
        missing, given = ("tls.key", "tls.cert") if tls.key is None else ("tls.cert", "tls.key")
        raise invalid_argument(f"{missing}: missing, {given} is set (give both or neither)")
    ca = _read("tls.ca", tls.ca)
    cert = _read("tls.cert", tls.cert)
    key = _read("tls.key", tls.key)
    return grpc.ssl_channel_credentials(
        root_certificates=ca, private_key=key, certificate_chain=cert
    )


def _metadata(api_key: str | None) -> tuple[tuple[str, str], ...]:
    if api_key is None:
        return ()
    if (
        not isinstance(api_key, str)
        or api_key == ""
        or not api_key.isascii()
        or any(c.isspace() or not c.isprintable() for c in api_key)
    ):
        raise invalid_argument(
            "api_key: must be a non-empty string of printable ASCII without whitespace"
        )
    return (("authorization", f"Bearer {api_key}"),)


def _seconds(name: str, value: float, minimum: float = 0.0) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value <= minimum
    ):
        raise invalid_argument(f"{name}: {value!r} is not a number of seconds above {minimum}")
    return float(value)


def build_settings(
    endpoints: Sequence[str] | str,
    *,
    api_key: str | None,
    tls: Tls | None,
    request_timeout: float,
    retry_budget: float,
    backoff: float,
    max_backoff: float,
) -> Settings:
    """Validates every setting; raises ``INVALID_ARGUMENT`` naming the parameter."""
    if isinstance(endpoints, str):
        endpoints = [endpoints]
    if not isinstance(endpoints, Sequence) or len(endpoints) == 0:
        raise invalid_argument("endpoints: give at least one endpoint (host:port)")
    if tls is not None and not isinstance(tls, Tls):
        raise invalid_argument(f"tls: {tls!r} is not a snowkeep_client.Tls")
    parsed = tuple(parse_endpoint(e, tls is not None) for e in endpoints)
    creds = credentials(tls) if any(e.tls for e in parsed) or tls is not None else None
    backoff = _seconds("backoff", backoff)
    max_backoff = _seconds("max_backoff", max_backoff)
    if max_backoff < backoff:
        raise invalid_argument(f"max_backoff: {max_backoff} is below backoff {backoff}")
    return Settings(
        endpoints=parsed,
        metadata=_metadata(api_key),
        credentials=creds,
        request_timeout=_seconds("request_timeout", request_timeout),
        retry_budget=_seconds("retry_budget", retry_budget),
        backoff=backoff,
        max_backoff=max_backoff,
    )


def check_count(count: int) -> int:
    """``count`` of ``next_ids``: 1 to 100,000."""
    if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= MAX_COUNT:
        raise invalid_argument(f"count: {count!r} is outside 1 to {MAX_COUNT}")
    return count


def check_stream(total: int, batch_size: int) -> None:
    """``total`` 1 to 2^63 - 1, ``batch_size`` 0 (the server's 1000) to 100,000."""
    if isinstance(total, bool) or not isinstance(total, int) or not 1 <= total <= MAX_TOTAL:
        raise invalid_argument(f"total: {total!r} is outside 1 to {MAX_TOTAL}")
    if (
        isinstance(batch_size, bool)
        or not isinstance(batch_size, int)
        or not 0 <= batch_size <= MAX_COUNT
    ):
        raise invalid_argument(
            f"batch_size: {batch_size!r} is outside 0 to {MAX_COUNT} (0: the server's 1000)"
        )


def check_timeout(timeout: float | None) -> float | None:
    """A caller's per-call ``timeout`` in seconds, or ``None``."""
    return None if timeout is None else _seconds("timeout", timeout)


def check_pool(batch: int, low_water: int | None, max_age: float) -> tuple[int, int, float]:
    """Pool sizes: ``batch`` 1 to 100,000, ``low_water`` 0 to batch - 1."""
    if isinstance(batch, bool) or not isinstance(batch, int) or not 1 <= batch <= MAX_COUNT:
        raise invalid_argument(f"batch: {batch!r} is outside 1 to {MAX_COUNT}")
    low = batch // 4 if low_water is None else low_water
    if isinstance(low, bool) or not isinstance(low, int) or not 0 <= low < batch:
        raise invalid_argument(f"low_water: {low_water!r} is outside 0 to {batch - 1} (batch - 1)")
    return batch, low, _seconds("max_age", max_age)
