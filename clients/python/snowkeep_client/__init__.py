"""snowkeep-client: the official Python client of snowkeep, a gRPC
distributed id service handing out 63-bit snowflake ids (as ``int``).

:class:`Client` (blocking) and :class:`AsyncClient` (asyncio) call one or
more servers with health-aware round-robin, failover and the retry rule of
``conformance/README.md``; ``next_ids(n)``, ``stream(total, batch_size)``
(exactly ``total`` ids, resumed on another server when one goes away),
``pool(...)`` (:class:`Pool` / :class:`AsyncPool`, prefetching) and
``decode(id)``. Every failure is a :class:`SnowkeepError` with ``.code``
(a :class:`grpc.StatusCode`) and ``.message``.
"""

from ._aio import AsyncClient, AsyncIdStream
from ._aio_pool import AsyncPool
from ._client import Client, IdStream
from ._errors import RETRYABLE_CODES, SnowkeepError, is_retryable
from ._layout import DecodedId, Layout
from ._options import MAX_COUNT, MAX_TOTAL, Tls
from ._pool import Pool

__all__ = [
    "MAX_COUNT",
    "MAX_TOTAL",
    "RETRYABLE_CODES",
    "AsyncClient",
    "AsyncIdStream",
    "AsyncPool",
    "Client",
    "DecodedId",
    "IdStream",
    "Layout",
    "Pool",
    "SnowkeepError",
    "Tls",
    "is_retryable",
]

__version__ = "0.1.0"
