"""The client's typed error and the one list of retryable gRPC codes."""

from __future__ import annotations

import grpc

__all__ = ["RETRYABLE_CODES", "SnowkeepError", "is_retryable"]

#: The gRPC codes after which the same call may succeed later or on another
#: server: the same list in every official snowkeep client. A transport
#: failure (refused connection, reset, TLS handshake failure) arrives as
#: ``UNAVAILABLE``. Every other code surfaces after one attempt.
RETRYABLE_CODES: frozenset[grpc.StatusCode] = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.UNKNOWN,
        grpc.StatusCode.CANCELLED,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.ABORTED,
        grpc.StatusCode.INTERNAL,
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.NOT_FOUND,
    }
)


def is_retryable(code: grpc.StatusCode) -> bool:
    """True when ``code`` is one of :data:`RETRYABLE_CODES`."""
    return code in RETRYABLE_CODES


class SnowkeepError(Exception):
    """A failed snowkeep call, or a setting refused before any call.

    ``code`` is the gRPC status code: the server's, or the client's own for
    what it refuses itself (``INVALID_ARGUMENT`` for a bad count, endpoint,
    API key or TLS file, naming the parameter; ``FAILED_PRECONDITION`` for a
    closed client or pool). ``message`` is the server's message, or the
    client's. When the retry budget is spent, both are those of the last
    retryable failure.
    """

    code: grpc.StatusCode
    message: str

    def __init__(
        self, code: grpc.StatusCode, message: str, *, retryable: bool | None = None
    ) -> None:
        super().__init__(code, message)
        self.code = code
        self.message = message
        self._retryable = retryable

    @property
    def code_name(self) -> str:
        """The code's canonical upper snake case name, e.g. ``"UNAVAILABLE"``."""
        return str(self.code.name)

    @property
    def retryable(self) -> bool:
        """True when the same call may succeed later or on another server: the
        code is one of :data:`RETRYABLE_CODES`, except for a closed client or
        pool (``FAILED_PRECONDITION`` that no retry heals)."""
        if self._retryable is not None:
            return self._retryable
        return is_retryable(self.code)

    def __str__(self) -> str:
        return f"{self.code.name}: {self.message}"

    def __repr__(self) -> str:
        return f"SnowkeepError({self.code!r}, {self.message!r})"


def invalid_argument(message: str) -> SnowkeepError:
    """The client's own refusal of a parameter, before any call."""
    return SnowkeepError(grpc.StatusCode.INVALID_ARGUMENT, message)


def client_closed() -> SnowkeepError:
    """What every call on a closed client raises."""
    return SnowkeepError(grpc.StatusCode.FAILED_PRECONDITION, "client closed", retryable=False)


def pool_closed() -> SnowkeepError:
    """What ``next()`` on a closed pool raises."""
    return SnowkeepError(grpc.StatusCode.FAILED_PRECONDITION, "pool closed", retryable=False)


def from_rpc_error(err: grpc.RpcError) -> SnowkeepError:
    """The typed error of a failed gRPC call (sync or asyncio)."""
    code = getattr(err, "code", None)
    details = getattr(err, "details", None)
    status = code() if callable(code) else grpc.StatusCode.UNKNOWN
    message = details() if callable(details) else str(err)
    if not isinstance(status, grpc.StatusCode):
        status = grpc.StatusCode.UNKNOWN
    return SnowkeepError(status, str(message or ""))
