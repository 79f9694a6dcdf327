"""Messages between the collector and its pipeline workers: over a Pipe to a worker process (headers pickled,
bodies sent raw), or as they are to the pipeline shard run in the collector process's own thread."""

from __future__ import annotations

import contextlib
import os
import queue
import socket
import struct
from typing import Any

import pyarrow as pa

PIPE_BUFFER = 4 << 20


def widen_pipe(conn: Any) -> None:
    """Give a Pipe's socket 4 MiB buffers: a request body (~1 MB) or a table then moves in a few system calls
    instead of dozens, each of which costs a GIL hand-off in a busy process."""
    with contextlib.suppress(OSError):
        sock = socket.socket(fileno=os.dup(conn.fileno()))
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, PIPE_BUFFER)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, PIPE_BUFFER)
        finally:
            sock.close()


# messages whose last item is a body: a request (~1 MB) to a worker, a table (~10 MB) back
_WITH_BODY = frozenset({"batch", "table"})


class LocalEnd:
    """One end of the channel between the collector and the shard it runs in a thread of its own process: a message,
    body included, passes as the object it is (no pickling, no copy). `close` makes the other end's next read past
    what was sent raise EOFError, as a Pipe whose process exited does."""

    _CLOSED = ("closed",)

    def __init__(self, inbox: queue.SimpleQueue[Any], outbox: queue.SimpleQueue[Any]) -> None:
        self._inbox, self._outbox = inbox, outbox

    def send(self, msg: tuple[Any, ...]) -> None:
        self._outbox.put(msg)

    def receive(self) -> tuple[Any, ...]:
        msg = self._inbox.get()
        if msg is self._CLOSED:
            self._inbox.put(msg)  # every later read ends too
            raise EOFError
        return msg

    def close(self) -> None:
        self._outbox.put(self._CLOSED)


def local_pair() -> tuple[LocalEnd, LocalEnd]:
    """The collector's end and the shard's end of a channel within one process."""
    there: queue.SimpleQueue[Any] = queue.SimpleQueue()
    here: queue.SimpleQueue[Any] = queue.SimpleQueue()
    return LocalEnd(here, there), LocalEnd(there, here)


def send_message(conn: Any, msg: tuple[Any, ...]) -> None:
    """Send a message; a body goes as raw bytes after its header, since pickling it would copy it twice more on
    each side (a 10 MB table: ~14 ms of the collector's CPU to receive pickled, ~3.5 ms raw)."""
    if isinstance(conn, LocalEnd):
        conn.send(msg)
    elif msg[0] in _WITH_BODY:
        conn.send(msg[:-1])
        conn.send_bytes(msg[-1])
    else:
        conn.send(msg)


def receive_message(conn: Any) -> tuple[Any, ...]:
    """The next message `send_message` sent, its body (if any) as a memoryview of memory the kernel wrote into
    directly: `Connection.recv_bytes` would copy it twice more while holding the GIL."""
    if isinstance(conn, LocalEnd):
        return conn.receive()
    msg = conn.recv()
    if msg[0] in _WITH_BODY:
        fd = conn.fileno()
        (size,) = struct.unpack("!i", _read(fd, 4))  # `send_bytes` framing: a 4-byte length, then the bytes
        if size == -1:  # 2 GiB or more: an 8-byte length follows
            (size,) = struct.unpack("!Q", _read(fd, 8))
        return (*msg, _read(fd, size))
    return msg


def _read(fd: int, size: int) -> memoryview:
    """`size` bytes into a buffer of Arrow's memory pool, which reuses its pages and leaves them as they are: a
    `bytearray` of a table (~10 MB) is zeroed while holding the GIL and, past glibc's mmap threshold, mapped fresh
    each time, so every page faults in and is unmapped again (14.5 against 4.2 ms of CPU a 10 MB read, with the
    threshold `tune_malloc` sets)."""
    view = memoryview(pa.allocate_buffer(size)).cast("B")  # Arrow exports signed bytes: compare as `bytes` do
    got = 0
    while got < size:
        n = os.readv(fd, [view[got:]])
        if n == 0:
            raise EOFError if got == 0 else OSError("the pipe closed in the middle of a message")
        got += n
    return view
