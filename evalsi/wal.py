"""The write-ahead log of `service.durability: {mode: wal}`: a request is answered only once it is on disk, and at
start what the store may not hold yet is replayed; segments are deleted once nothing of theirs is held in memory.

It never acknowledges past damage: an append that fails (a full disk, an I/O error, a short write) is cut back to the
last whole record, or, when even that fails, its segment is closed and what it left there is voided in the next one
before anything more is acknowledged; a request refused after its append is voided too. Replay leaves voided records
out and reads past a damaged record to the next whole one."""

from __future__ import annotations

import asyncio
import contextlib
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
from evalsi.model.score import DEFAULT_PROJECT
from evalsi.model.span import PROJECT_ATTRIBUTE
from evalsi.runtime.telemetry import SelfMetrics

log = logging.getLogger("evalsi.wal")

MIB = 1024 * 1024
SEGMENT_BYTES = 32 * MIB
"""A segment is closed past this size, so that it can be deleted once its items are stored."""
SEGMENT_SECONDS = 1.0
"""...or once it is this old and not empty (a quiet collector deletes what it holds within seconds)."""
_MAGIC = b"EVW2"
_HEADER = 12  # magic, length, crc32
_VOID = 0
"""The signal code of a void record: its body is the sequence number of a record replay leaves out (refused)."""
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
    return _frame(head + name + proj + body)


def _encode_void(seq: int, voided: int) -> bytes:
    """A record saying that record `voided` was refused: replay leaves it out."""
    return _frame(struct.pack("<QBBHH", seq, _VOID, 0, 0, 0) + struct.pack("<Q", voided))


def _frame(rest: bytes) -> bytes:
    return _MAGIC + struct.pack("<II", len(rest), zlib.crc32(rest)) + rest


@dataclass(slots=True)
class SegmentScan:
    """What reading a segment found: its whole records (void ones as `voids`), and what it could not read."""

    records: list[Record] = field(default_factory=list)
    voids: set[int] = field(default_factory=set)
    """Sequence numbers of records to leave out: refused after they were written."""
    skipped_bytes: int = 0
    """Damaged bytes between whole records, read past to the next whole record."""
    why: str = ""
    """Why reading stopped before the end ("" when it did not): a torn or damaged tail."""


def scan_segment(data: bytes) -> SegmentScan:
    """The records of a segment's bytes. A damaged stretch with whole records after it is read past (counted in
    `skipped_bytes`): what follows was acknowledged. A torn tail (the process died, or a write failed, while writing
    it) was never answered: it is where the segment ends."""
    scan = SegmentScan()
    pos = 0
    while pos < len(data):
        parsed = _record_at(data, pos)
        if parsed is None:
            found = _next_record(data, pos + 1)
            if found < 0:
                scan.why = f"a torn or damaged record at byte {pos}"
                break
            scan.skipped_bytes += found - pos
            pos = found
            continue
        record, pos = parsed
        if record.signal == "void":
            scan.voids.add(struct.unpack("<Q", record.body)[0])
        else:
            scan.records.append(record)
    return scan


def _record_at(data: bytes, pos: int) -> tuple[Record, int] | None:
    """The whole record at `pos` and where the next one starts, or None when there is none there."""
    if len(data) - pos < _HEADER + 14 or data[pos : pos + 4] != _MAGIC:
        return None
    length, crc = struct.unpack_from("<II", data, pos + 4)
    rest = data[pos + _HEADER : pos + _HEADER + length]
    if len(rest) != length or length < 14 or zlib.crc32(rest) != crc:
        return None
    seq, signal, fmt, name_len, proj_len = struct.unpack_from("<QBBHH", rest)
    end = pos + _HEADER + length
    if signal == _VOID and length == 22:
        return Record(seq, "void", "protobuf", "", bytes(rest[14:])), end
    if signal not in _SIGNAL_NAMES or fmt not in _FORMAT_NAMES:
        return None
    at = 14 + name_len
    name = rest[14:at].decode(errors="replace")
    project = rest[at : at + proj_len].decode(errors="replace")
    kind, form = _SIGNAL_NAMES[signal], _FORMAT_NAMES[fmt]
    return Record(seq, kind, form, name, bytes(rest[at + proj_len :]), project), end  # type: ignore[arg-type]


def _next_record(data: bytes, pos: int) -> int:
    """Where the next whole record at or after `pos` starts, or -1."""
    while (pos := data.find(_MAGIC, pos)) >= 0:
        if _record_at(data, pos) is not None:
            return pos
        pos += 1
    return -1


def read_segment(path: Path) -> tuple[list[Record], str]:
    """The whole records of a segment (void ones left out, not applied), and why reading stopped early ("" at its
    end). A torn last record (the process died while writing it) was never answered: it is where the log of that
    run ends."""
    scan = scan_segment(path.read_bytes())
    return scan.records, scan.why


@dataclass(eq=False)
class _Segment:
    path: Path
    size: int = 0
    newest: float = 0.0  # when (monotonic) the newest of its requests reached a receiver
    opened: float = field(default_factory=time.monotonic)
    closed: bool = False


@dataclass(slots=True, eq=False)
class _Pending:
    seq: int
    data: bytes
    arrived: float
    done: asyncio.Future[None] | None
    voids: int = 0  # a void record's: the record it voids


class Disk:
    """The system calls the log writes its segments with (a test puts failures here: a full disk, EIO, a short
    write)."""

    def open(self, path: Path) -> int:
        return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)

    def write(self, fd: int, data: memoryview) -> int:
        return os.write(fd, data)

    def fdatasync(self, fd: int) -> None:
        os.fdatasync(fd)

    def ftruncate(self, fd: int, length: int) -> None:
        os.ftruncate(fd, length)

    def sync_directory(self, directory: Path) -> None:
        dir_fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


RECOVER_INTERVAL = 1.0
"""While the log cannot be written, how often (seconds) the writer tries to open a new segment."""


class WriteAheadLog:
    """Appends are written by one thread, many at a time, with one fdatasync for all of them (group commit); each
    `append` returns once its record is on disk. `retire(watermark)` deletes the closed segments whose requests all
    reached a receiver before `watermark`, the arrival of the oldest item any component still holds.

    A group whose write or fdatasync fails is refused whole and cut back (truncated to where it began); when the cut
    back fails too, the segment takes nothing more, and the group's records are owed a void record, written before
    any later append is acknowledged. While no segment can be opened, `check_room` refuses every request."""

    def __init__(self, config: DurabilityConfig, metrics: SelfMetrics, disk: Disk | None = None) -> None:
        self.config = config
        self.directory = Path(config.directory)
        self.disk = disk or Disk()
        self._max_bytes = config.max_size_mib * MIB
        self._segments: list[_Segment] = []
        self._active: _Segment | None = None
        self._fd = -1
        self._seq = 0
        self._segment_number = 0  # of the newest segment: names sort in writing order
        self._lock = threading.Lock()  # the segment list and the active file
        self._wake = threading.Condition(threading.Lock())
        self._pending: list[_Pending] = []
        self._owed: list[int] = []  # records of refused requests a failed cut back may have left: voided next write
        self._broken = ""  # why no segment is open ("" while one is): every request is refused until one opens
        self._last_try = 0.0
        self._unsettled: dict[int, float] = {}  # appended, not yet handed on or voided: seq -> arrival
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._voided: set[int] = set()  # the previous run's voided records, left out of its replay
        self.replayed_spans = ReplayedSpans()
        """The spans replayed at start, so that a sender's second copy of them is not stored twice."""
        self.replayable: list[Path] = []
        """The segments a previous run left, oldest first, until `replayed`."""
        self._bytes = metrics.gauge("evalsi_wal_bytes", "Bytes in the write-ahead log's segments.", [])
        self._appended = metrics.counter(
            "evalsi_wal_records", "Requests written to the write-ahead log before they were answered.", []
        )
        self._syncs = metrics.counter("evalsi_wal_syncs", "fdatasync calls of the write-ahead log.", [])
        self._failed = metrics.counter(
            "evalsi_wal_write_failures",
            "Write-ahead log writes that failed (a full disk, an I/O error): their requests were refused, 503.",
            [],
        )
        self._voids = metrics.counter(
            "evalsi_wal_voided_records",
            "Write-ahead log records voided (left out of replay): their requests were refused after the write.",
            [],
        )
        self._skipped = metrics.counter(
            "evalsi_wal_replay_skipped_bytes",
            "Damaged bytes replay read past to the next whole record of a write-ahead log segment.",
            [],
        )
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
            if path.stat().st_size:  # voids may follow their records in a later segment: all are read first
                scan = scan_segment(path.read_bytes())
                self._voided |= scan.voids
                self._seq = max([self._seq, *(r.seq for r in scan.records), *scan.voids])
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
        """Open the next segment, then close the active one (the caller holds the lock, or nothing else runs yet).
        Raises OSError, the active segment unchanged, when the new one cannot be made durable."""
        self._segment_number += 1
        path = self.directory / f"wal-{self._segment_number:012d}.log"
        fd = self.disk.open(path)
        try:
            self.disk.sync_directory(self.directory)  # the new file's name survives a crash
        except OSError:
            os.close(fd)
            with contextlib.suppress(OSError):
                path.unlink()
            raise
        if self._active is not None:
            self._active.closed = True
        if self._fd >= 0:
            os.close(self._fd)
        self._fd = fd
        self._active = _Segment(path)
        self._segments.append(self._active)
        self._broken = ""

    # --- appending ---

    def check_room(self) -> None:
        """Raise `Refused` (503) while the log is at its size limit (the store is behind or down), or while it cannot
        be written (no segment could be opened since a write failed)."""
        if self._broken:
            raise self._refusal(self._broken)
        if self.size >= self._max_bytes:
            raise Refused(
                f"the write-ahead log holds {self.size // MIB} MiB (service.durability.max_size_mib) while the "
                "store catches up; retry later",
                unavailable=True,
                retry_after=5.0,
            )

    def _refusal(self, error: str) -> Refused:
        return Refused(
            f"the write-ahead log cannot be written in {str(self.directory)!r} ({error}): is its disk full? "
            "retry later",
            unavailable=True,
            retry_after=5.0,
        )

    async def append(
        self, signal: str, fmt: Format, receiver: str, body: bytes, arrived: float, project: str = ""
    ) -> int:
        """Return once the request is on disk (or raise `Refused` if it cannot be written: then nothing of it is
        replayed). Returns its sequence number: the caller hands the request on, then calls `settled`, or `void`
        when the request is refused after all."""
        assert self._loop is not None, "append before open"
        done: asyncio.Future[None] = self._loop.create_future()
        with self._wake:
            self._seq += 1
            seq = self._seq
            self._unsettled[seq] = arrived  # its segment is not deleted before the pipeline holds it
            self._pending.append(_Pending(seq, _encode(seq, signal, fmt, receiver, body, project), arrived, done))
            self._wake.notify()
        try:
            await done
        except BaseException:
            self._unsettled.pop(seq, None)
            raise
        return seq

    def settled(self, seq: int) -> None:
        """The appended request `seq` was handed on (a component holds it now) or voided."""
        self._unsettled.pop(seq, None)

    async def void(self, seq: int) -> None:
        """The appended request `seq` was refused after all (the sender sends it again): write a void record, so that
        replay leaves it out. Returns once that is on disk; if it cannot be written, it is owed, written before any
        later append is acknowledged (a crash before that replays the request)."""
        assert self._loop is not None, "void before open"
        done: asyncio.Future[None] = self._loop.create_future()
        with self._wake:
            self._seq += 1
            self._pending.append(_Pending(self._seq, _encode_void(self._seq, seq), time.monotonic(), done, seq))
            self._wake.notify()
        try:
            await done
        except Refused:
            pass  # owed (see `_write`)
        finally:
            self.settled(seq)

    def _write_loop(self) -> None:
        while True:
            with self._wake:
                while not self._pending and not self._stopping:
                    if self._broken and time.monotonic() - self._last_try >= RECOVER_INTERVAL:
                        break
                    self._wake.wait(min(0.25, RECOVER_INTERVAL) if self._broken else 0.25)
                batch, self._pending = self._pending, []
                stopping = self._stopping
            if batch:
                error = self._write(batch)
                loop = self._loop
                assert loop is not None
                for p in batch:
                    if p.done is not None:
                        loop.call_soon_threadsafe(_settle, p.done, error)
            elif stopping:
                return
            elif self._broken:
                with self._lock:
                    self._recover()

    def _recover(self) -> bool:
        """With the lock held: open a new segment if none is open (a cut back failed). Whether one is open."""
        if not self._broken:
            return True
        self._last_try = time.monotonic()
        try:
            self._roll()
        except OSError as e:
            self._broken = str(e)
            return False
        assert self._active is not None
        log.warning("the write-ahead log can be written again: a new segment is open", extra={
            "segment": self._active.path.name})  # fmt: skip
        return True

    def _write(self, batch: list[_Pending]) -> BaseException | None:
        with self._wake:  # the void records owed since a cut back failed go first: nothing is acknowledged before
            owed, self._owed = self._owed, []
            now = time.monotonic()
            group: list[_Pending] = []
            for voided in owed:
                self._seq += 1
                group.append(_Pending(self._seq, _encode_void(self._seq, voided), now, None, voided))
        group += batch
        with self._lock:
            if not self._recover():
                self._failed.inc()
                self._owe([p.voids for p in group if p.voids])  # nothing was written: only voids are still owed
                return self._refusal(self._broken)
            active = self._active
            assert active is not None
            start = active.size
            data = b"".join(p.data for p in group)
            try:
                view = memoryview(data)
                while view:
                    n = self.disk.write(self._fd, view)
                    view = view[n:]
                self.disk.fdatasync(self._fd)
            except OSError as e:
                self._failed.inc()
                cut = self._cut_back(active, start, e)
                # voids are owed still; if the cut back failed, so are the requests it may have left whole
                self._owe([p.voids or p.seq for p in group if p.voids or not cut])
                return self._refusal(str(e))
            active.size += len(data)
            active.newest = max(active.newest, max(p.arrived for p in group))
            if active.size >= SEGMENT_BYTES:
                self._roll_or_keep()
        voids = sum(1 for p in group if p.voids)
        self._appended.inc(len(group) - voids)
        self._voids.inc(voids)
        self._syncs.inc()
        self._bytes.set(self.size)
        return None

    def _owe(self, seqs: list[int]) -> None:
        with self._wake:
            self._owed[:0] = seqs

    def _cut_back(self, active: _Segment, start: int, error: OSError) -> bool:
        """With the lock held, after a failed write: truncate the segment to `start`, where the failed group began,
        so that the next append follows the last whole record. If that fails too (False), the segment takes nothing
        more, and a new one is opened (at once, or by the writer later: until then every request is refused)."""
        try:
            self.disk.ftruncate(self._fd, start)
            self.disk.fdatasync(self._fd)
        except OSError as again:
            log.error(
                "cannot write the write-ahead log, nor cut the failed write back; requests are refused until a new "
                "segment opens",
                extra={"error": str(error), "cut_back_error": str(again), "segment": active.path.name},
            )
            active.closed = True
            with contextlib.suppress(OSError):
                active.size = os.fstat(self._fd).st_size
            os.close(self._fd)
            self._fd = -1
            self._active = None
            self._broken = str(again)
            self._recover()
            return False
        log.error(
            "cannot write the write-ahead log; the failed write was cut back and its requests refused",
            extra={"error": str(error), "segment": active.path.name, "at": start},
        )
        return True

    def _roll_or_keep(self) -> None:
        """With the lock held: close the active segment and open the next, or keep writing the active one (logged)."""
        try:
            self._roll()
        except OSError as e:
            log.warning("cannot open a new write-ahead log segment; the active one grows", extra={"error": str(e)})

    # --- retiring ---

    def retire(self, watermark: float, *, closing: bool = False) -> int:
        """Delete the closed segments whose requests all arrived before `watermark`; close the active one once it is
        old enough (or `closing`: at shutdown). Returns how many were deleted."""
        removed = 0
        if self._unsettled:  # written, not yet handed on: no component reports them yet
            watermark = min(watermark, *self._unsettled.values())
        with self._lock:
            active = self._active
            if closing:  # shutdown: nothing is appended any more
                if active is not None:
                    active.closed = True
            elif active is not None and active.size and time.monotonic() - active.opened >= SEGMENT_SECONDS:
                self._roll_or_keep()
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
        """A previous run's segment's records (for replay), without those it voided (refused after they were
        written); damaged bytes between whole records are read past (counted), a torn tail is logged and ends it."""
        scan = scan_segment(path.read_bytes())
        if scan.skipped_bytes:
            self._skipped.inc(scan.skipped_bytes)
            log.error(
                "write-ahead log segment damaged: read past to the next whole record",
                extra={"segment": path.name, "skipped_bytes": scan.skipped_bytes},
            )
        if scan.why:
            log.warning(
                "write-ahead log segment ends early: what follows was never answered",
                extra={"segment": path.name, "records": len(scan.records), "why": scan.why},
            )
        yield from (r for r in scan.records if r.seq not in self._voided)


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
