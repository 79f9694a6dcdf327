"""An OTLP request kept encoded: what a receiver hands to pipeline worker processes, which decode it themselves."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol, runtime_checkable


@dataclass(slots=True, frozen=True)
class EncodedBatch:
    """A checked OTLP export request: `body` is its protobuf encoding (JSON requests are re-encoded), `count` the
    valid items in it, and `shards` the workers owning at least one of their traces (see `shard_of`)."""

    signal: Literal["traces", "logs"]
    body: bytes
    count: int
    shards: frozenset[int]
    receiver: str = ""

    def __len__(self) -> int:
        return self.count


@runtime_checkable
class EncodedConsumer(Protocol):
    shards: int
    """How many workers the items are sharded over."""

    async def consume_encoded(self, batch: EncodedBatch) -> None:
        """Take the batch or raise `Refused`, as `Consumer.consume` does."""
        ...
