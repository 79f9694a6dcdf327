"""Who holds an embedded (chDB) store: ClickHouse locks its directory for one process, and a collector holding it
records where its API answers (`SERVED_BY`), so another process reads through that API instead of finding it locked.
Light on purpose (no chDB, no pyarrow): the reading commands ask it before deciding how to read."""

from __future__ import annotations

import errno
import fcntl
import json
import os
import time
from pathlib import Path
from typing import Any

from evalsi.store import StoreBusy


class StoreLocked(StoreBusy):
    pass


def _lock_holder(path: Path) -> int | None:
    """The pid holding ClickHouse's `status` lock on `path`, None when free. ClickHouse takes it with flock."""
    status = path / "status"
    if not status.exists():
        return None
    fd = os.open(status, os.O_RDONLY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise
            text = status.read_text(errors="replace")
            for line in text.splitlines():
                if line.startswith("PID:"):
                    return int(line.split(":", 1)[1].strip() or 0)
            return 0
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


SERVED_BY = "evalsi-served-by.json"
"""In an embedded store's directory while a collector holds it: {"pid", "api", "role"} (role `serve` or `run`)."""
LOCK_WAIT_S = 5.0
"""How long to wait for an embedded store held by a process that serves no API (a reading command holds it for
well under a second; a collector starting writes `SERVED_BY` once its API listens)."""


def served_by(path: Path) -> dict[str, Any] | None:
    """The collector serving the embedded store at `path` (its `SERVED_BY` record), None when none holds the store
    or its holder recorded no API. A record left by a process that no longer holds the lock counts for nothing."""
    holder = _lock_holder(path) if path.exists() else None
    if not holder:
        return None
    try:
        record = json.loads((path / SERVED_BY).read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and record.get("pid") == holder else None


def wait_for_store(path: Path, wait_s: float = LOCK_WAIT_S) -> dict[str, Any] | None:
    """Wait until the embedded store at `path` is free (None) or served by a collector (its record); `StoreLocked`
    when a process that serves nothing holds it past `wait_s`."""
    deadline = time.monotonic() + wait_s
    while True:
        holder = _lock_holder(path) if path.exists() else None
        if holder is None:
            return None
        record = served_by(path)
        if record is not None:
            return record
        if time.monotonic() >= deadline:
            who = f" (pid {holder})" if holder else ""
            raise StoreLocked(
                f"store at {path} is locked by another evalsi process{who}; "
                "stop that process or give this one another store endpoint"
            )
        time.sleep(0.1)
