"""memory_limiter: refuses data where the receivers hand it on while the collector's memory (the anonymous resident
memory of its process and of its pipeline workers) is above a soft limit, as the OpenTelemetry Collector's
memory_limiter does, and collects garbage in every process above the hard limit. The API asks it too before it reads
a request body (`admit_body`), which it refuses above the soft limit or when the body would pass the hard one."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import gc
import logging
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from pydantic import Field, ValidationInfo, field_validator, model_validator

from evalsi.component import ComponentConfig, Next, Refused, Settings, processor
from evalsi.duration import Duration
from evalsi.model.log_record import LogBatch
from evalsi.model.span import SpanBatch
from evalsi.runtime.supervise import supervise

MIB = 1 << 20
# cgroup v1 writes a page-rounded 2^63 for "no limit"; nothing real comes near 2^60 bytes
UNLIMITED = 1 << 60
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
# the retry delay a refusal asks for grows with how long the limiter has refused, up to this: a sender that retries
# a fixed number of times (the OpenTelemetry SDKs: 6) then keeps its data through a longer episode
MAX_RETRY_AFTER = 30.0
ITEMS_PER_CHECK = 2_000
"""Spans or log records admitted between two checks at most: memory is checked again before more are taken (at
16k spans/s, eight checks a second; a check reads /proc for each process, well under a millisecond)."""
PARSED_BODY_FACTOR = 3
"""What a JSON body the API reads costs, in times its size: the bytes, then the Python objects parsed from them
(measured: a 300 MB body took the collector from 430 to 1,249 MB resident)."""


# --- config ------------------------------------------------------------------------------------------------------


class MemoryLimiterConfig(ComponentConfig):
    """The Collector's memory_limiter settings (its default `gcstats` model). As there, 0 means unset."""

    check_interval: Duration = 1.0
    """How often the memory is measured; between two checks it may grow by up to the spike limit."""
    limit_mib: int = Field(default=0, ge=0)
    """The hard limit, in MiB of anonymous resident memory of the collector and its pipeline workers together."""
    limit_percentage: int = Field(default=0, ge=0)
    """The hard limit as a percentage of the container's memory limit (cgroup), else of the machine's memory."""
    spike_limit_mib: int = Field(default=0, ge=0)
    """With `limit_mib`: the growth expected between two checks; soft limit = limit - spike. 0: 20% of the limit."""
    spike_limit_percentage: int = Field(default=0, ge=0)
    """With `limit_percentage`: the spike, in percent of the same memory. 0: 20% of the limit."""
    min_gc_interval_when_soft_limited: Duration = 10.0
    """While above the soft limit, garbage is collected (and freed memory handed back) at most this often."""
    min_gc_interval_when_hard_limited: Duration = 0.0
    """While above the hard limit, at most this often (0: at every check)."""

    @field_validator("check_interval")
    @classmethod
    def _interval(cls, value: float) -> float:
        if value <= 0:
            raise ValueError("must be greater than 0 (1s is a good start): the limiter measures memory this often")
        return value

    @field_validator("limit_percentage")
    @classmethod
    def _percentage(cls, value: int, info: ValidationInfo) -> int:
        if value > 100:
            raise ValueError(f"must be a percentage from 1 to 100, got {value}")
        if value and info.data.get("limit_mib"):
            raise ValueError("set limit_mib or limit_percentage, not both (the Collector would ignore this one)")
        return value

    @field_validator("spike_limit_mib")
    @classmethod
    def _spike_mib(cls, value: int, info: ValidationInfo) -> int:
        if not value:
            return value
        limit = info.data.get("limit_mib") or 0
        if not limit:
            raise ValueError(
                "applies to limit_mib, which is not set; with limit_percentage, set spike_limit_percentage"
            )
        if value >= limit:
            raise ValueError(
                f"must be below limit_mib ({value} >= {limit}): the soft limit (limit_mib - spike_limit_mib) would "
                "be 0 or less, and every request would be refused"
            )
        return value

    @field_validator("spike_limit_percentage")
    @classmethod
    def _spike_percentage(cls, value: int, info: ValidationInfo) -> int:
        if not value:
            return value
        limit = info.data.get("limit_percentage") or 0
        if not limit:
            raise ValueError("applies to limit_percentage, which is not set; with limit_mib, set spike_limit_mib")
        if value >= limit:
            raise ValueError(
                f"must be below limit_percentage ({value} >= {limit}): the soft limit would be 0 or less, and every "
                "request would be refused"
            )
        return value

    @model_validator(mode="after")
    def _has_limit(self) -> MemoryLimiterConfig:
        if not self.limit_mib and not self.limit_percentage:
            raise ValueError(
                "set limit_mib or limit_percentage: without a limit the memory_limiter would never refuse anything"
            )
        if self.min_gc_interval_when_soft_limited < self.min_gc_interval_when_hard_limited:
            raise ValueError(
                "min_gc_interval_when_soft_limited must be at least min_gc_interval_when_hard_limited: above the "
                "hard limit garbage is collected at least as often as above the soft one"
            )
        return self


# --- what the host tells: memory available, memory in use ---------------------------------------------------------


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def _cgroup_mounts(root: Path) -> list[tuple[str, str, Path]]:
    """(limit file, the mount's own root in the cgroup tree, where it is mounted) for the cgroup v2 hierarchy and the
    cgroup v1 memory hierarchy, from /proc/self/mountinfo."""
    mounts = []
    for line in (_read(root / "proc/self/mountinfo") or "").splitlines():
        fields, _, tail = line.partition(" - ")
        parts, after = fields.split(), tail.split()
        if len(parts) < 5 or len(after) < 3:
            continue
        fstype, options = after[0], after[2].split(",")
        where = root / parts[4].lstrip("/")
        if fstype == "cgroup2":
            mounts.append(("memory.max", parts[3], where))
        elif fstype == "cgroup" and "memory" in options:
            mounts.append(("memory.limit_in_bytes", parts[3], where))
    return mounts


def _own_cgroups(root: Path) -> dict[str, str]:
    """This process's cgroup path per hierarchy: `memory.max` for v2 (`0::path`), `memory.limit_in_bytes` for the
    v1 memory controller (`N:...memory...:path`)."""
    groups = {}
    for line in (_read(root / "proc/self/cgroup") or "").splitlines():
        number, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if number == "0" and not controllers:
            groups["memory.max"] = path
        elif "memory" in controllers.split(","):
            groups["memory.limit_in_bytes"] = path
    return groups


def cgroup_memory_limit(root: Path = Path("/")) -> tuple[int, str] | None:
    """The smallest memory limit set on this process's cgroup or its ancestors (cgroup v2 `memory.max`, v1
    `memory.limit_in_bytes`), with the file it came from; None when no limit is set or cgroups are not mounted."""
    groups = _own_cgroups(root)
    found: tuple[int, str] | None = None
    for file, mount_root, mountpoint in _cgroup_mounts(root):
        path = groups.get(file)
        if path is None:
            continue
        inside = path == mount_root or path.startswith(mount_root.rstrip("/") + "/")
        folder = mountpoint / os.path.relpath(path, mount_root) if inside else mountpoint
        if not folder.is_dir():  # a cgroup namespace shows the host's path: the mount is this cgroup
            folder = mountpoint
        while True:
            text = (_read(folder / file) or "").strip()
            if text.isdigit() and int(text) < UNLIMITED and (found is None or int(text) < found[0]):
                found = (int(text), "/" + str((folder / file).relative_to(root)))
            if folder == mountpoint or mountpoint not in folder.parents:
                break
            folder = folder.parent
    return found


def machine_memory(root: Path = Path("/")) -> int | None:
    """MemTotal from /proc/meminfo, in bytes."""
    for line in (_read(root / "proc/meminfo") or "").splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024
    return None


def total_memory(root: Path = Path("/")) -> tuple[int, str]:
    """The memory this process may use: its cgroup's limit when one is set, else the machine's, and where that came
    from; raises OSError when neither can be read."""
    machine = machine_memory(root)
    limit = cgroup_memory_limit(root)
    if limit is not None and (machine is None or limit[0] < machine):
        return limit[0], f"the cgroup limit in {limit[1]}"
    if machine is None:
        raise OSError("cannot read /proc/meminfo or a cgroup memory limit; set limit_mib instead of limit_percentage")
    return machine, "the machine's memory (/proc/meminfo)"


def anonymous_resident_bytes(pid: int, proc: Path = Path("/proc")) -> int | None:
    """A process's anonymous resident memory (RssAnon: its heaps and buffers) from /proc/<pid>/statm, or None when
    it is gone. The rest of its RSS is mapped files, mostly library code: shared by the workers, dropped and read
    again by the kernel under pressure, and counted once per process in a sum of RSS (the embedded store's library
    alone is ~280 MiB)."""
    try:  # read at every check for every process: the plain system calls, not pathlib's text reading
        fd = os.open(proc / str(pid) / "statm", os.O_RDONLY)
    except OSError:
        return None
    try:
        fields = os.read(fd, 256).split()
    except OSError:  # it ended since
        return None
    finally:
        os.close(fd)
    return (int(fields[1]) - int(fields[2])) * PAGE_SIZE  # resident - shared (RssFile + RssShmem)


def _malloc_trim() -> Callable[[], Any] | None:
    with contextlib.suppress(OSError, AttributeError):
        trim = ctypes.CDLL(None).malloc_trim  # glibc
        trim.argtypes = [ctypes.c_size_t]
        return lambda: trim(0)
    return None


_TRIM = _malloc_trim()


def release_memory() -> None:
    """Collect garbage, then hand what is free back to the system. Without the second step resident memory seldom
    falls: CPython's freed objects stay in the C heap, and Arrow's freed buffers in its own pool."""
    gc.collect()
    if _TRIM is not None:
        _TRIM()
    arrow = sys.modules.get("pyarrow")  # the store's row encoding; released only when something loaded it
    if arrow is not None:
        arrow.default_memory_pool().release_unused()


# --- the limits and the state the receivers' boundary reads -------------------------------------------------------


@dataclass(frozen=True)
class Limits:
    hard: int
    soft: int
    source: str
    """How they were set, for the start line: `limit_mib`, or a percentage of which memory."""


def limits(config: MemoryLimiterConfig, memory: Callable[[], tuple[int, str]] = total_memory) -> Limits:
    """The hard and soft limits in bytes (`memory` is asked only for percentages)."""
    if config.limit_mib:
        hard = config.limit_mib * MIB
        spike = config.spike_limit_mib * MIB or hard // 5
        return Limits(hard, hard - spike, "limit_mib")
    total, where = memory()
    hard = total * config.limit_percentage // 100
    spike = total * config.spike_limit_percentage // 100 or hard // 5
    return Limits(hard, hard - spike, f"{config.limit_percentage}% of {total // MIB} MiB, {where}")


class Limiter:
    """Whether to refuse, decided every check interval from the memory in use; reading it costs nothing.

    Above the hard limit, and while refusing at most every `gc_soft` seconds, it has garbage collected
    (`release("hard" | "soft")`) and measures again. The Collector forces a GC only on entering the soft-limited
    state; here resident memory seldom falls by itself once freed, so it is released again while refusing.
    """

    def __init__(
        self,
        limits: Limits,
        measure: Callable[[], int],
        release: Callable[[str], None],
        *,
        gc_soft: float,
        gc_hard: float,
        log: logging.Logger,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.limits = limits
        self.measure = measure
        self.release = release
        self.gc_soft = gc_soft
        self.gc_hard = gc_hard
        self.log = log
        self.clock = clock
        self.refusing = False
        self.refusing_since = 0.0
        self.usage = 0
        self._above_hard = False
        self._released_at = -float("inf")

    def _release(self, why: str, now: float) -> int:
        t0 = time.monotonic()
        self.release(why)
        self._released_at = now
        usage = self.measure()
        self.log.debug(
            "memory_limiter: collected garbage (%s limit): %d MiB in use after %.0f ms",
            why, usage // MIB, (time.monotonic() - t0) * 1000,
        )  # fmt: skip
        return usage

    def check(self) -> None:
        now = self.clock()
        usage = self.measure()
        hard, soft = self.limits.hard, self.limits.soft
        released = False
        if usage >= hard:
            if not self._above_hard:
                self._above_hard = True
                self.log.warning(
                    "memory_limiter: %d MiB in use is above the hard limit of %d MiB; collecting garbage in every "
                    "process", usage // MIB, hard // MIB,
                )  # fmt: skip
            if now - self._released_at >= self.gc_hard:
                usage, released = self._release("hard", now), True
        if usage < hard:
            self._above_hard = False
        refusing = usage >= soft
        if refusing and not released and now - self._released_at >= self.gc_soft:
            usage = self._release("soft", now)
            refusing = usage >= soft
        if refusing and not self.refusing:
            self.refusing_since = now
            self.log.warning(
                "memory_limiter: %d MiB in use is above the soft limit of %d MiB (hard %d MiB); refusing data "
                "(503, retryable) until it falls below", usage // MIB, soft // MIB, hard // MIB,
            )  # fmt: skip
        elif self.refusing and not refusing:
            self.log.info(
                "memory_limiter: %d MiB in use is below the soft limit of %d MiB again; accepting data",
                usage // MIB, soft // MIB,
            )  # fmt: skip
        self.refusing = refusing
        self.usage = usage


# --- the processor -----------------------------------------------------------------------------------------------


class Workers(Protocol):
    """The pipeline worker processes, whose memory counts with the collector's (`WorkerPool`)."""

    @property
    def pids(self) -> list[int]: ...

    def collect_garbage(self, processor: str) -> None:
        """Have `processor`'s instance in each worker call `collect_garbage()`."""
        ...


@processor(
    "memory_limiter", config=MemoryLimiterConfig, signals=("traces", "logs"), meets=True,
    first="it refuses data where the receivers hand it on, so the sender keeps it and retries",
)  # fmt: skip
class MemoryLimiter:
    """Refuses every batch while the memory in use is above the soft limit, with a retryable 503 / UNAVAILABLE.

    It must be the first processor of its pipelines (the service checks). In one process it is the pipeline's head:
    its `consume` refuses. With pipeline workers the pipelines run elsewhere, so its instance in the collector
    process (`meets`) measures the collector and every worker, and the service asks its `admit` before the pool takes
    a request; the workers' instances hand every batch on and collect garbage when asked.
    """

    def __init__(self, config: MemoryLimiterConfig, settings: Settings, next: Next) -> None:
        self.config = config
        self.settings = settings
        self.next = next
        self.active = settings.worker is None  # in a worker, the collector process decides
        self._workers: Workers | None = None
        self._task: asyncio.Task[None] | None = None
        self._min_retry_after = max(1.0, config.check_interval)
        self.limiter: Limiter | None = None
        if not self.active:
            return
        m, cid = settings.metrics, settings.id
        self._usage = m.gauge(
            "evalsi_memory_limiter_usage_bytes",
            "Anonymous resident memory (RssAnon) of the collector process and its pipeline workers together, at the "
            "last check.",
            ["processor"],
        ).labels(cid)
        self._limit = m.gauge(
            "evalsi_memory_limiter_limit_bytes", "The memory limiter's hard and soft limits.", ["processor", "limit"]
        )
        self._refusing = m.gauge(
            "evalsi_memory_limiter_refusing",
            "1 while memory is above the soft limit and data is refused.",
            ["processor"],
        ).labels(cid)
        releases = m.counter(
            "evalsi_memory_limiter_garbage_collections",
            "Garbage collections forced above the soft or hard limit (in the collector and every worker).",
            ["processor", "limit"],
        )
        self._releases = {why: releases.labels(cid, why) for why in ("soft", "hard")}
        self._refused_requests = m.counter(
            "evalsi_memory_limiter_refused_api_requests",
            "API requests with a body refused (503, retryable): memory above the soft limit, or the body would take "
            "it past the hard limit.",
            ["processor"],
        ).labels(cid)
        self._bodies = 0
        self._admitted = 0
        """Items admitted since the last check (`admit` checks again past `ITEMS_PER_CHECK`)."""
        """What the API's request bodies admitted and not yet answered cost (`admit_body`), in bytes."""
        self._refused = {
            "traces": m.counter(
                "otelcol_processor_refused_spans", "Spans a processor refused (the sender retries them).", ["processor"]
            ).labels(cid),
            "logs": m.counter(
                "otelcol_processor_refused_log_records",
                "Log records a processor refused (the sender retries them).",
                ["processor"],
            ).labels(cid),
        }

    def watch(self, workers: Workers) -> None:
        """With pipeline workers: count their memory too, and collect garbage in them (called by the service)."""
        self._workers = workers

    def _measure(self) -> int:
        pids = [os.getpid(), *(self._workers.pids if self._workers is not None else [])]
        return sum(anonymous_resident_bytes(pid) or 0 for pid in pids)

    def _release(self, why: str) -> None:
        self._releases[why].inc()
        release_memory()
        if self._workers is not None:
            self._workers.collect_garbage(self.settings.id)

    def collect_garbage(self) -> None:
        """In a pipeline worker: the collector process asks, above a limit."""
        release_memory()

    async def start(self) -> None:
        if not self.active:
            return
        if anonymous_resident_bytes(os.getpid()) is None:
            raise OSError("memory_limiter reads resident memory from /proc/<pid>/statm, which this system lacks")
        found = limits(self.config)
        log = self.settings.logger
        self.limiter = Limiter(
            found,
            self._measure,
            self._release,
            gc_soft=self.config.min_gc_interval_when_soft_limited,
            gc_hard=self.config.min_gc_interval_when_hard_limited,
            log=log,
        )
        self._limit.labels(self.settings.id, "hard").set(found.hard)
        self._limit.labels(self.settings.id, "soft").set(found.soft)
        log.info(
            "memory_limiter: hard limit %d MiB, soft limit %d MiB (%s), checked every %gs",
            found.hard // MIB, found.soft // MIB, found.source, self.config.check_interval,
        )  # fmt: skip
        with contextlib.suppress(OSError):
            total, where = total_memory()
            if found.hard > total:
                log.warning(
                    "memory_limiter: the hard limit of %d MiB is above %s (%d MiB): the system runs out first",
                    found.hard // MIB, where, total // MIB,
                )  # fmt: skip
        self._check()
        self._task = supervise(f"{self.settings.id} checks", self._run, log=log, metrics=self.settings.metrics)

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.config.check_interval)
            self._check()

    def _check(self) -> None:
        assert self.limiter is not None
        self._admitted = 0
        self.limiter.check()
        self._usage.set(self.limiter.usage)
        self._refusing.set(1 if self.limiter.refusing else 0)

    async def shutdown(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def admit(self, signal: str, items: int) -> None:
        """Raise `Refused` (unavailable: 503 / UNAVAILABLE with a retry delay) while memory is above the soft limit.

        Reads the state the last check left, except that once `ITEMS_PER_CHECK` items were admitted since the last
        check it checks again first: between two timed checks a fast sender would otherwise take the process well
        past the hard limit. The delay is how long it has refused so far, at least 1 s (and `check_interval`), at
        most `MAX_RETRY_AFTER`."""
        limiter = self.limiter
        if limiter is not None:
            self._admitted += items
            if self._admitted >= ITEMS_PER_CHECK:
                self._check()
        if limiter is not None and limiter.refusing:
            self._refused[signal].inc(items)
            raise self._over_soft(limiter)

    def _over_soft(self, limiter: Limiter) -> Refused:
        refused_for = limiter.clock() - limiter.refusing_since
        return Refused(
            f"memory_limiter: the collector uses {limiter.usage // MIB} MiB, above its soft limit of "
            f"{limiter.limits.soft // MIB} MiB; retry later",
            unavailable=True,
            retry_after=min(MAX_RETRY_AFTER, max(self._min_retry_after, refused_for)),
        )

    def admit_body(self, size: int) -> None:
        """The API, before it reads `size` more bytes of a request body: `Refused` (503 with a retry delay) while
        memory is above the soft limit, as `admit`, and also when the body, parsed (`PARSED_BODY_FACTOR` times its
        size), on top of the memory in use at the last check and of the bodies admitted and not yet answered, would
        pass the hard limit. Admitted, it counts until `release_body`: between two checks the limiter sees none of
        it, so concurrent bodies cannot together pass the hard limit unseen."""
        limiter = self.limiter
        if limiter is None:
            return
        if limiter.refusing:
            self._refused_requests.inc()
            raise self._over_soft(limiter)
        cost = size * PARSED_BODY_FACTOR
        if cost and limiter.usage + self._bodies + cost > limiter.limits.hard:
            self._refused_requests.inc()
            raise Refused(
                f"memory_limiter: a request body of {size} bytes, with the {limiter.usage // MIB} MiB in use and the "
                f"{self._bodies // MIB} MiB of request bodies being answered, would pass the hard limit of "
                f"{limiter.limits.hard // MIB} MiB; retry later",
                unavailable=True,
                retry_after=self._min_retry_after,
            )
        self._bodies += cost

    def release_body(self, size: int) -> None:
        """The bytes `admit_body` admitted for a request whose answer is sent."""
        if self.limiter is not None:
            self._bodies = max(0, self._bodies - size * PARSED_BODY_FACTOR)

    async def consume(self, batch: SpanBatch) -> None:
        if self.active:
            self.admit("traces", len(batch))
        await self.next.consume(batch)

    async def consume_logs(self, batch: LogBatch) -> None:
        if self.active:
            self.admit("logs", len(batch))
        await self.next.consume_logs(batch)
