"""An OTLP request kept encoded: what a receiver hands to pipeline worker processes, which decode it themselves."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Protocol, runtime_checkable

from evalsi.model.log_record import LogBatch
from evalsi.model.span import SpanBatch

if TYPE_CHECKING:  # the data model imports nothing above it at run time
    from evalsi.runtime.telemetry import SelfMetrics


@dataclass(slots=True, frozen=True)
class EncodedBatch:
    """A checked OTLP export request: `body` is its protobuf encoding (JSON requests are re-encoded), `count` the
    valid items in it, and `shards` the slots holding at least one of their traces (see `shard_of`; the pool knows
    which worker owns each slot)."""

    signal: Literal["traces", "logs"]
    body: bytes | memoryview  # a protobuf body as HTTP read it is a view of Arrow-pool memory
    count: int
    shards: frozenset[int]
    receiver: str = ""
    arrived: float = 0.0  # when (monotonic) it reached the receiver, with a write-ahead log (else 0)
    project: str = ""  # the project its sender's credential writes to ("": the spans keep the one they name)
    answer_by: float = 0.0
    """When (monotonic) its sender stops waiting for the answer (a gRPC deadline); 0 when it did not say."""

    def __len__(self) -> int:
        return self.count


@runtime_checkable
class EncodedConsumer(Protocol):
    shards: int
    """How many slots the items are sharded over (one a worker, unless the collector's own shard takes fewer)."""

    async def consume_encoded(self, batch: EncodedBatch) -> None:
        """Take the batch or raise `Refused`, as `Consumer.consume` does."""
        ...


class Decoder(Protocol):
    """How a pipeline worker decodes a receiver's encoded request: the items of the traces of its shard
    (`shard` is (the slots it owns as bits, how many slots)), their clamps counted in `metrics` and logged to `log`."""

    def __call__(
        self, batch: EncodedBatch, shard: tuple[int, int], *, metrics: SelfMetrics, log: logging.Logger
    ) -> SpanBatch | LogBatch: ...
