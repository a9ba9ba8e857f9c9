"""Decoding ids under the layout a server reports (InfoService.GetInfo)."""

from __future__ import annotations

from dataclasses import dataclass

import grpc

from ._errors import SnowkeepError, invalid_argument

__all__ = ["DecodedId", "Layout"]


@dataclass(frozen=True)
class DecodedId:
    """An id's parts.

    ``unix_ms``: the first millisecond of the id's tick, in milliseconds since
    the Unix epoch. ``machine_id``: the machine id that issued it.
    ``sequence``: its sequence within the tick.
    """

    unix_ms: int
    machine_id: int
    sequence: int


@dataclass(frozen=True)
class Layout:
    """A namespace's bit layout: timestamp bits first, then machine id bits,
    then sequence bits; ticks of ``time_unit_ms`` since ``epoch_unix_ms``."""

    timestamp_bits: int
    machine_bits: int
    sequence_bits: int
    epoch_unix_ms: int
    time_unit_ms: int

    @property
    def total_bits(self) -> int:
        """Bits of an id: 32 to 63."""
        return self.timestamp_bits + self.machine_bits + self.sequence_bits

    @property
    def max_id(self) -> int:
        """The layout's largest id, 2^total_bits - 1."""
        return (1 << self.total_bits) - 1

    def decode(self, id: int) -> DecodedId:
        """The parts of ``id``; ``INVALID_ARGUMENT`` naming ``id`` when it is
        not an int from 0 to :attr:`max_id`."""
        if isinstance(id, bool) or not isinstance(id, int) or not 0 <= id <= self.max_id:
            raise invalid_argument(
                f"id: {id!r} is outside 0 to {self.max_id}, the largest id of a "
                f"{self.total_bits}-bit layout"
            )
        sequence = id & ((1 << self.sequence_bits) - 1)
        machine_id = (id >> self.sequence_bits) & ((1 << self.machine_bits) - 1)
        ticks = id >> (self.sequence_bits + self.machine_bits)
        unit = self.time_unit_ms or 1
        return DecodedId(self.epoch_unix_ms + ticks * unit, machine_id, sequence)


def layout_of(info: object, has_api_key: bool) -> Layout:
    """The layout of a GetInfoResponse.

    A server with API keys on reports it only to a call with a key, and a
    server that has not read the cluster's security mode yet to none: without
    ``api_key`` that is ``UNAUTHENTICATED`` (not retried), with one
    ``UNAVAILABLE`` (retried under the retry rule).
    """
    layout = getattr(info, "layout", None)
    has = getattr(info, "HasField", None)
    if layout is None or not callable(has) or not has("layout"):
        if has_api_key:
            raise SnowkeepError(
                grpc.StatusCode.UNAVAILABLE,
                "the server reported no layout in GetInfo (it has not read the "
                "cluster's security mode yet, or does not accept the API key)",
            )
        raise SnowkeepError(
            grpc.StatusCode.UNAUTHENTICATED,
            "the server reported no layout in GetInfo: with API keys on it reports "
            "it only to a call with an API key (api_key)",
        )
    out = Layout(
        int(layout.timestamp_bits),
        int(layout.machine_bits),
        int(layout.sequence_bits),
        int(layout.epoch_unix_ms),
        int(layout.time_unit_ms),
    )
    if not 1 <= out.total_bits <= 64:
        raise SnowkeepError(
            grpc.StatusCode.FAILED_PRECONDITION,
            f"the server reported a layout of {out.total_bits} bits",
        )
    return out
