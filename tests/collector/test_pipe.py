"""Messages over the collector-worker pipe: a body arrives byte for byte and reads as the `bytes` it was."""

from __future__ import annotations

import multiprocessing
import os
import threading

import pyarrow as pa
import pytest

from evalsi.collector.workers.pipe import receive_message, send_message, widen_pipe
from evalsi.exporters.clickhouse.rows import from_ipc, ipc_stream


@pytest.fixture
def pipe():
    a, b = multiprocessing.get_context("spawn").Pipe(duplex=True)
    for end in (a, b):
        widen_pipe(end)
    yield a, b
    a.close()
    b.close()


def _send_in_thread(conn, messages):
    t = threading.Thread(target=lambda: [send_message(conn, m) for m in messages])
    t.start()
    return t


@pytest.mark.parametrize("size", [0, 1, 4096, 3 << 20])
def test_a_body_arrives_byte_for_byte_and_compares_as_bytes(pipe, size):
    a, b = pipe
    body = os.urandom(size)  # every byte value, the high ones included
    t = _send_in_thread(a, [("batch", 7, "traces", "otlp", 1.5, "p1", body), ("ack", 7, None)])
    kind, seq, signal, receiver, arrived, project, got = receive_message(b)
    assert (kind, seq, signal, receiver, arrived, project) == ("batch", 7, "traces", "otlp", 1.5, "p1")
    assert len(got) == size
    assert got == body  # a slice compares with `bytes` too, as the limits trailer check does
    assert got[-4:] == body[-4:]
    assert bytes(got) == body
    assert receive_message(b) == ("ack", 7, None)  # the next message is where it should be
    t.join()


def test_a_table_is_read_back_from_the_received_body(pipe):
    a, b = pipe
    table = pa.table({"TraceId": ["a" * 32, "é" * 16], "Duration": [1, 2 << 40]})
    t = _send_in_thread(a, [("table", "spans", None, bytes(ipc_stream(table)))])
    kind, rows, arrived, body = receive_message(b)
    assert (kind, rows, arrived) == ("table", "spans", None)
    assert from_ipc(body).equals(table)
    t.join()
