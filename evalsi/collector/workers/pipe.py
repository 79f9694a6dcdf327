"""Messages between the collector and its pipeline workers over a Pipe: headers pickled, bodies sent raw."""

from __future__ import annotations

import contextlib
import os
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


def send_message(conn: Any, msg: tuple[Any, ...]) -> None:
    """Send a message; a body goes as raw bytes after its header, since pickling it would copy it twice more on
    each side (a 10 MB table: ~14 ms of the collector's CPU to receive pickled, ~3.5 ms raw)."""
    if msg[0] in _WITH_BODY:
        conn.send(msg[:-1])
        conn.send_bytes(msg[-1])
    else:
        conn.send(msg)


def receive_message(conn: Any) -> tuple[Any, ...]:
    """The next message `send_message` sent, its body (if any) as a memoryview of memory the kernel wrote into
    directly: `Connection.recv_bytes` would copy it twice more while holding the GIL."""
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
