"""Which slot of the pipeline workers a trace falls in, and the limits a checked request carries to the workers."""

from __future__ import annotations

import struct
from functools import lru_cache

from evalsi.receivers.otlp.config import Limits
from evalsi.receivers.otlp.decoded import LIMITS


def shard_of(trace_id: bytes, shards: int) -> int:
    """The slot a trace falls in, of the pool's `shards` (one a worker, or shares: `WorkerPool`): its id's low 64
    bits (random in W3C ids) modulo the slot count, as `trace_shard` does with hex ids. Records without a trace id
    go to slot 0."""
    return int.from_bytes(trace_id[8:], "big") % shards if len(trace_id) == 16 else 0


# With pipeline workers, a request's limits go to the workers with it: its body (the protobuf request) is followed by
# one more field, of a number no OTLP message uses, holding them (so the body stays a valid request), which the
# worker's decoding reads back; a body without it is decoded with the defaults. So a worker never decodes with other
# limits than those of the receiver that checked the request, and with the default limits the body is not copied.
_LIMIT_KEYS = tuple(Limits.model_fields)
_LIMITS_FORMAT = struct.Struct(f"<{len(_LIMIT_KEYS)}q")
_TRAILER_FIELD = 0x7E5A1  # 517537
_TRAILER_MAGIC = b"evalsi.limits/1"


def _varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


_TRAILER_HEAD = _varint(_TRAILER_FIELD << 3 | 2) + _varint(len(_TRAILER_MAGIC) + _LIMITS_FORMAT.size) + _TRAILER_MAGIC
_TRAILER_SIZE = len(_TRAILER_HEAD) + _LIMITS_FORMAT.size


def limits_trailer(limits: Limits) -> bytes:
    """What follows a checked request's body on its way to a worker: the limits to decode it with."""
    return _TRAILER_HEAD + _LIMITS_FORMAT.pack(*(getattr(limits, k) for k in _LIMIT_KEYS))


@lru_cache(maxsize=64)
def _limits_of(values: tuple[int, ...]) -> Limits:
    return Limits.model_construct(**dict(zip(_LIMIT_KEYS, values, strict=True)))


def split_limits(body: bytes) -> tuple[Limits, bytes | memoryview]:
    """The limits a checked request's body carries, and the request without them (the defaults and the body as it
    is, when it carries none)."""
    end = len(body) - _LIMITS_FORMAT.size
    if len(body) < _TRAILER_SIZE or body[end - len(_TRAILER_HEAD) : end] != _TRAILER_HEAD:
        return LIMITS, body
    return _limits_of(_LIMITS_FORMAT.unpack_from(body, end)), memoryview(body)[: len(body) - _TRAILER_SIZE]
