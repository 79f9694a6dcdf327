"""The write-ahead log of `service.durability: {mode: wal}`: a request is answered only once it is on disk, and at
start what the store may not hold yet is replayed; segments are deleted once nothing of theirs is held in memory."""

from __future__ import annotations

import asyncio
import logging
import os
import struct
import threading
import time
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

from pydantic import Field, field_validator

from evalsi.component import ComponentConfig, Refused
from evalsi.score import DEFAULT_PROJECT
from evalsi.span import PROJECT_ATTRIBUTE
from evalsi.telemetry import SelfMetrics

log = logging.getLogger("evalsi.wal")

MIB = 1024 * 1024
SEGMENT_BYTES = 32 * MIB
"""A segment is closed past this size, so that it can be deleted once its items are stored."""
SEGMENT_SECONDS = 1.0
"""...or once it is this old and not empty (a quiet collector deletes what it holds within seconds)."""
_MAGIC = b"EVW2"
_SIGNALS = {"traces": 1, "logs": 2}
_SIGNAL_NAMES = {v: k for k, v in _SIGNALS.items()}
Format = Literal["protobuf", "json"]
_FORMATS: dict[str, int] = {"protobuf": 1, "json": 2}
_FORMAT_NAMES = {v: k for k, v in _FORMATS.items()}


class DurabilityConfig(ComponentConfig):
    """`service.durability`. `memory` (the default): an answered request lives in memory until the store takes it,
    and a crash (kill -9, power loss) loses what was queued. `wal`: each request is written and fsynced to a
    write-ahead log before it is answered, and replayed at start until the store holds it."""

    mode: Literal["memory", "wal"] = "memory"
    directory: str = ".evalsi/wal"
    max_size_mib: int = Field(default=1024, gt=0)
    """When the log holds this much (the store is behind or down), receivers answer 503 with Retry-After."""

    @field_validator("directory")
    @classmethod
    def _directory(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("an empty directory: write where the log lives, e.g. /var/lib/evalsi/wal")
        return v


@dataclass(slots=True)
class Record:
    seq: int
    signal: str
    format: Format
    receiver: str
    body: bytes
    project: str = ""


def _encode(seq: int, signal: str, fmt: Format, receiver: str, body: bytes, project: str = "") -> bytes:
    name, proj = receiver.encode(), project.encode()
    head = struct.pack("<QBBHH", seq, _SIGNALS[signal], _FORMATS[fmt], len(name), len(proj))
    rest = head + name + proj + body
    return _MAGIC + struct.pack("<II", len(rest), zlib.crc32(rest)) + rest


def read_segment(path: Path) -> tuple[list[Record], str]:
    """The whole records of a segment, and why reading stopped early ("" at its end). A torn last record (the
    process died while writing it) was never answered: it is where the log of that run ends."""
    data = path.read_bytes()
    records: list[Record] = []
    pos = 0
    while pos < len(data):
        if len(data) - pos < 12 or data[pos : pos + 4] != _MAGIC:
            return records, f"no record header at byte {pos}"
        length, crc = struct.unpack_from("<II", data, pos + 4)
        rest = data[pos + 12 : pos + 12 + length]
        if len(rest) != length or zlib.crc32(rest) != crc:
            return records, f"a torn or damaged record at byte {pos}"
        seq, signal, fmt, name_len, proj_len = struct.unpack_from("<QBBHH", rest)
        at = 14 + name_len
        name = rest[14:at].decode(errors="replace")
        project = rest[at : at + proj_len].decode(errors="replace")
        if signal not in _SIGNAL_NAMES or fmt not in _FORMAT_NAMES:
            return records, f"an unknown record kind at byte {pos}"
        kind, form = _SIGNAL_NAMES[signal], _FORMAT_NAMES[fmt]
        records.append(Record(seq, kind, form, name, bytes(rest[at + proj_len :]), project))  # type: ignore[arg-type]
        pos += 12 + length
    return records, ""


@dataclass(eq=False)
class _Segment:
    path: Path
    size: int = 0
    newest: float = 0.0  # when (monotonic) the newest of its requests reached a receiver
    opened: float = field(default_factory=time.monotonic)
    closed: bool = False


@dataclass(slots=True, eq=False)
class _Pending:
    data: bytes
    arrived: float
    done: asyncio.Future[None]


class WriteAheadLog:
    """Appends are written by one thread, many at a time, with one fdatasync for all of them (group commit); each
    `append` returns once its record is on disk. `retire(watermark)` deletes the closed segments whose requests all
    reached a receiver before `watermark`, the arrival of the oldest item any component still holds."""

    def __init__(self, config: DurabilityConfig, metrics: SelfMetrics) -> None:
        self.config = config
        self.directory = Path(config.directory)
        self._max_bytes = config.max_size_mib * MIB
        self._segments: list[_Segment] = []
        self._active: _Segment | None = None
        self._fd = -1
        self._seq = 0
        self._segment_number = 0  # of the newest segment: names sort in writing order
        self._lock = threading.Lock()  # the segment list and the active file
        self._wake = threading.Condition(threading.Lock())
        self._pending: list[_Pending] = []
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self.replayed_spans = ReplayedSpans()
        """The spans replayed at start, so that a sender's second copy of them is not stored twice."""
        self.replayable: list[Path] = []
        """The segments a previous run left, oldest first, until `replayed`."""
        self._bytes = metrics.gauge("evalsi_wal_bytes", "Bytes in the write-ahead log's segments.", [])
        self._appended = metrics.counter(
            "evalsi_wal_records", "Requests written to the write-ahead log before they were answered.", []
        )
        self._syncs = metrics.counter("evalsi_wal_syncs", "fdatasync calls of the write-ahead log.", [])
        self.duplicates = metrics.counter(
            "evalsi_wal_duplicate_spans",
            "Spans dropped on arrival after a restart: a sender sent again what the write-ahead log replayed.",
            [],
        )
        self._retired = metrics.counter(
            "evalsi_wal_segments_retired", "Write-ahead log segments deleted: nothing of theirs is held any more.", []
        )

    # --- lifecycle ---

    def open(self) -> None:
        """Create the directory, list what a previous run left (to replay), and open a new segment after it."""
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            probe = self.directory / ".probe"
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as e:
            raise OSError(
                f"service.durability.directory: cannot write the write-ahead log in {str(self.directory)!r} ({e}); "
                "give a writable directory"
            ) from None
        left = sorted(self.directory.glob("wal-*.log"))
        for path in left:
            self._segments.append(_Segment(path, path.stat().st_size, closed=True))
            number = path.stem.removeprefix("wal-")
            if number.isdigit():
                self._segment_number = max(self._segment_number, int(number))
        self.replayable = list(left)
        self._roll()
        self._bytes.set(self.size)
        self._loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._write_loop, name="evalsi-wal", daemon=True)
        self._thread.start()

    def replayed(self, path: Path, handed_at: float) -> None:
        """A previous run's segment was handed to the pipelines again; it retires like any other from now."""
        with self._lock:
            for s in self._segments:
                if s.path == path:
                    s.newest = handed_at
            self.replayable = [p for p in self.replayable if p != path]

    def close(self) -> None:
        """Stop the writer (after what is pending is written). The segments stay: the next start retires or replays
        them."""
        with self._wake:
            self._stopping = True
            self._wake.notify()
        if self._thread is not None:
            self._thread.join(10)
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1

    @property
    def size(self) -> int:
        return sum(s.size for s in self._segments)

    def _roll(self) -> None:
        """Close the active segment and open the next (the caller holds the lock, or nothing else runs yet)."""
        if self._active is not None:
            self._active.closed = True
            if self._fd >= 0:
                os.close(self._fd)
        self._segment_number += 1
        path = self.directory / f"wal-{self._segment_number:012d}.log"
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        dir_fd = os.open(self.directory, os.O_RDONLY)
        try:
            os.fsync(dir_fd)  # the new file's name survives a crash
        finally:
            os.close(dir_fd)
        self._active = _Segment(path)
        self._segments.append(self._active)

    # --- appending ---

    def check_room(self) -> None:
        """Raise `Refused` (503) while the log is at its size limit (the store is behind or down)."""
        if self.size >= self._max_bytes:
            raise Refused(
                f"the write-ahead log holds {self.size // MIB} MiB (service.durability.max_size_mib) while the "
                "store catches up; retry later",
                unavailable=True,
                retry_after=5.0,
            )

    async def append(
        self, signal: str, fmt: Format, receiver: str, body: bytes, arrived: float, project: str = ""
    ) -> None:
        """Return once the request is on disk (or raise `Refused` if it cannot be written)."""
        assert self._loop is not None, "append before open"
        done: asyncio.Future[None] = self._loop.create_future()
        with self._wake:
            self._seq += 1
            self._pending.append(_Pending(_encode(self._seq, signal, fmt, receiver, body, project), arrived, done))
            self._wake.notify()
        await done

    def _write_loop(self) -> None:
        while True:
            with self._wake:
                while not self._pending and not self._stopping:
                    self._wake.wait(0.25)
                batch, self._pending = self._pending, []
                stopping = self._stopping
            if batch:
                error = self._write(batch)
                loop = self._loop
                assert loop is not None
                for p in batch:
                    loop.call_soon_threadsafe(_settle, p.done, error)
            elif stopping:
                return

    def _write(self, batch: list[_Pending]) -> BaseException | None:
        data = b"".join(p.data for p in batch)
        try:
            with self._lock:
                active = self._active
                assert active is not None
                view = memoryview(data)
                while view:
                    n = os.write(self._fd, view)
                    view = view[n:]
                os.fdatasync(self._fd)
                active.size += len(data)
                active.newest = max(active.newest, max(p.arrived for p in batch))
                if active.size >= SEGMENT_BYTES:
                    self._roll()
        except OSError as e:
            log.error("cannot write the write-ahead log; requests are refused until it can", extra={"error": str(e)})
            return Refused(f"the write-ahead log cannot be written ({e}); retry later", unavailable=True, retry_after=5)
        self._appended.inc(len(batch))
        self._syncs.inc()
        self._bytes.set(self.size)
        return None

    # --- retiring ---

    def retire(self, watermark: float, *, closing: bool = False) -> int:
        """Delete the closed segments whose requests all arrived before `watermark`; close the active one once it is
        old enough (or `closing`: at shutdown). Returns how many were deleted."""
        removed = 0
        with self._lock:
            active = self._active
            if closing:  # shutdown: nothing is appended any more
                if active is not None:
                    active.closed = True
            elif active is not None and active.size and time.monotonic() - active.opened >= SEGMENT_SECONDS:
                self._roll()
            keep: list[_Segment] = []
            replaying = set(self.replayable)
            for s in self._segments:
                if s.closed and s.path not in replaying and s.newest < watermark:
                    try:
                        s.path.unlink()
                    except FileNotFoundError:
                        pass
                    removed += 1
                    continue
                keep.append(s)
            self._segments = keep
        if removed:
            self._retired.inc(removed)
            self._bytes.set(self.size)
        return removed

    def records(self, path: Path) -> Iterator[Record]:
        """A previous run's segment's records (for replay); a torn tail is logged and ends it."""
        records, stopped = read_segment(path)
        if stopped:
            log.warning(
                "write-ahead log segment ends early: what follows was never answered",
                extra={"segment": path.name, "records": len(records), "why": stopped},
            )
        yield from records


def _settle(future: asyncio.Future[None], error: BaseException | None) -> None:
    if future.done():
        return
    if error is None:
        future.set_result(None)
    else:
        future.set_exception(error)


class StoredSpanKeys(Protocol):
    """The store's answer to which spans of some traces it holds, within one project."""

    def __call__(self, trace_ids: list[str], *, project: str | None = None) -> set[tuple[str, str]]: ...


def without_stored_spans(body: bytes, stored: StoredSpanKeys, project: str = "") -> tuple[bytes | None, int]:
    """An ExportTraceServiceRequest without the spans the store holds (`stored`, asked per project: trace id and
    span id in hex): the request to replay (None when nothing is left) and how many spans were left out. `project`:
    the sender's credential's; "" when none was checked (each resource's own, see `resource_project`). Another
    project's span with the same ids is not this span."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    request = ExportTraceServiceRequest.FromString(body)
    by_project: dict[str, set[str]] = {}
    total = 0
    for rs in request.resource_spans:
        ids = by_project.setdefault(resource_project(rs.resource.attributes, project), set())
        for ss in rs.scope_spans:
            total += len(ss.spans)
            ids.update(s.trace_id.hex() for s in ss.spans if len(s.trace_id) == 16)
    held: set[str] = set()
    for p, ids in by_project.items():
        if ids:
            held.update(span_key(p, t, s) for t, s in stored(sorted(ids), project=p))
    if not held:
        return body, 0
    left, skipped = drop_spans(body, held.__contains__, project=project)
    return (left if skipped < total else None), skipped


def span_key(project: str, trace_id: str, span_id: str) -> str:
    """A span's identity across projects (ids in lowercase hex): what replay and its dedup compare."""
    return f"{project}/{trace_id}{span_id}"


def resource_project(attributes: Iterable[Any], project: str = "") -> str:
    """The project of a ResourceSpans' spans: the sender's credential's (`project`) when one was checked, else the
    resource's `evalsi.project` attribute, else `default` (as the receiver stamps and the store reads them)."""
    if project:
        return project
    for kv in attributes:
        if kv.key == PROJECT_ATTRIBUTE and kv.value.string_value:
            return kv.value.string_value
    return DEFAULT_PROJECT


REPLAYED_KEYS_MAX = 5_000_000
REPLAYED_TTL_S = 600.0


class ReplayedSpans:
    """The spans of the requests a replay handed on, for `REPLAYED_TTL_S` after the start: a sender that never got
    the answer to a request the log held sends it again, and those spans are dropped (counted), not stored twice."""

    def __init__(self) -> None:
        self._keys: set[str] = set()
        self._until = 0.0
        self.full = False

    def add(self, body: bytes, project: str = "") -> None:
        """Note the spans of a replayed ExportTraceServiceRequest, each within its project (`resource_project`)."""
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

        if len(self._keys) >= REPLAYED_KEYS_MAX:
            self.full = True
            return
        request = ExportTraceServiceRequest.FromString(body)
        for rs in request.resource_spans:
            p = resource_project(rs.resource.attributes, project)
            for ss in rs.scope_spans:
                self._keys.update(span_key(p, s.trace_id.hex(), s.span_id.hex()) for s in ss.spans)
        self._until = time.monotonic() + REPLAYED_TTL_S

    def active(self) -> bool:
        if self._keys and time.monotonic() >= self._until:
            self._keys.clear()
        return bool(self._keys)

    def again(self, key: str) -> bool:
        """Whether the span (its `span_key`) was replayed and now comes again (once: then it is forgotten)."""
        if key in self._keys:
            self._keys.discard(key)
            return True
        return False


def _key(project: str | None, trace_id: str, span_id: str) -> str:
    return trace_id + span_id if project is None else span_key(project, trace_id, span_id)


def drop_spans(body: bytes, drop: Callable[[str], bool], *, project: str | None = None) -> tuple[bytes, int]:
    """An ExportTraceServiceRequest without the spans `drop(key)` is true for, and how many were left out (the body
    unchanged when none). The key is the trace id + span id in hex, or the `span_key` in its project (see
    `resource_project`) when `project` is given: the credential's, or "" when none was checked."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    request = ExportTraceServiceRequest.FromString(body)
    dropped = 0
    for rs in request.resource_spans:
        p = None if project is None else resource_project(rs.resource.attributes, project)
        for ss in rs.scope_spans:
            keep = [s for s in ss.spans if not drop(_key(p, s.trace_id.hex(), s.span_id.hex()))]
            if len(keep) != len(ss.spans):
                dropped += len(ss.spans) - len(keep)
                copies = [type(s).FromString(s.SerializeToString()) for s in keep]
                del ss.spans[:]
                ss.spans.extend(copies)
    return (request.SerializeToString() if dropped else body), dropped
