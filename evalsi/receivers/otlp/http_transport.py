"""OTLP/HTTP: `POST /v1/traces` in protobuf or JSON, gzip or zstd, answered per the OTLP spec (every error with a
`google.rpc.Status` in the request's encoding)."""

from __future__ import annotations

import asyncio
import logging
import zlib
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any, TypeVar

import pyarrow as pa
import zstandard
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from evalsi.auth.asgi_gate import PRINCIPAL_SCOPE_KEY
from evalsi.auth.principal import Principal
from evalsi.component import Refused
from evalsi.receivers.otlp.decode import Codec, Decoded, DecodeFailed, OverLimit, ReceiverLimits
from evalsi.receivers.otlp.drain import RETRY_AFTER, SHUTTING_DOWN, Drain
from evalsi.receivers.otlp.status import HTTP_TO_CODE, JSON, PROTOBUF, Violation, encode, status_message

logger = logging.getLogger("evalsi.receiver.otlp")

Export = Callable[[Codec, Decoded, str, bytes, bool, Principal | None], Awaitable[None]]
"""How a transport hands on a decoded request: with the transport's name, the body as decoded, whether it is JSON,
and who sent it (None: no credential is checked)."""
T = TypeVar("T")

# Compressed bodies are inflated, and inflated bodies larger than this decoded, in threads, so that a big request
# does not hold the event loop (and every other request, /healthz included) for its whole decoding. Below it the
# thread hop would cost more than it saves.
OFF_LOOP_BYTES = 64 * 1024
POOLED_BODY_BYTES = 128 * 1024
"""A body from this size up is put together in Arrow's memory pool (see `_joined`)."""
# Those threads: their own, not the event loop's default executor, which the API's store queries (/readyz among
# them) share, so a burst of big requests cannot queue those. Decoding holds the GIL: more would not go faster.
DECODE_THREADS = 4

# Each compressed member (gzip member, zlib stream, zstd frame) is fed to its decompressor in slices that start
# this small and double while the member goes on: what a decompressor copies out as `unused_data` is bounded by
# the last slice, so a body of many tiny members costs time linear in its size, not quadratic.
_FIRST_SLICE = 256
_MAX_SLICE = 1 << 20
# The zstd frame check's output buffer, one a frame: below glibc's mmap threshold (`tune_malloc`, 128 KiB), so it
# comes from the heap and is reused; zstd's default (128 KiB + 3 bytes) was mapped and unmapped for each frame, and
# 160,000 empty frames took 2-3 s instead of 0.4 (tests/receivers/test_otlp_hostile_bodies.py)
_CHECK_WRITE_SIZE = 1 << 16


class _TooLarge(Exception):
    pass


def _media_type(content_type: str) -> str:
    return content_type.split(";", 1)[0].strip().lower()


def _inflate_gzip(body: bytes, wbits: int, limit: int) -> bytes:
    """Every member of the body (RFC 1952 allows several; a zlib body may hold several streams too), inflated
    with the output bounded by `limit` as a whole."""
    view = memoryview(body)
    end = len(view)
    out = bytearray()
    pos = 0
    while pos < end:
        d = zlib.decompressobj(wbits)
        step = _FIRST_SLICE
        while True:
            chunk = view[pos : pos + step]
            # at most one byte past the limit, so a bomb stops there (and then the whole chunk need not be read)
            out += d.decompress(chunk, limit + 1 - len(out))
            if len(out) > limit:
                raise _TooLarge
            if d.eof:
                pos += len(chunk) - len(d.unused_data)
                break
            pos += len(chunk)  # under the output bound, the whole slice was consumed
            if pos >= end:
                raise ValueError("truncated compressed body")
            step = min(step * 2, _MAX_SLICE)
    return bytes(out)


def _inflate_zstd(body: bytes, limit: int) -> bytes:
    # the bounded read across every frame (RFC 8878, skippable frames included) stops a bomb; a frame cut short
    # reads as nothing there, so completeness is checked frame by frame on input already known to inflate within
    # the limit (a decompressobj has no output bound of its own)
    out = zstandard.ZstdDecompressor().stream_reader(body, read_across_frames=True).read(limit + 1)
    if len(out) > limit:
        raise _TooLarge
    view = memoryview(body)
    end = len(view)
    dctx = zstandard.ZstdDecompressor()  # each decompressobj resets it: one frame at a time
    pos = 0
    while pos < end:
        d = dctx.decompressobj(write_size=_CHECK_WRITE_SIZE)
        step = _FIRST_SLICE
        while True:
            chunk = view[pos : pos + step]
            d.decompress(chunk)
            if d.eof:
                pos += len(chunk) - len(d.unused_data)
                break
            pos += len(chunk)
            if pos >= end:
                raise ValueError("truncated compressed body")
            step = min(step * 2, _MAX_SLICE)
    return out


def _joined(chunks: list[bytes], size: int) -> bytes | memoryview:
    """A protobuf request body from the chunks it arrived in. From `POOLED_BODY_BYTES` up it goes in a buffer of Arrow's
    memory pool, which reuses its pages: a `bytes` that size is mapped fresh by glibc each time (`tune_malloc`), and
    its page faults and unmapping cost ~0.32 ms a 0.8 MB body, against ~0.05 from reused memory
    (`benchmarks/pipe_read.py --size 0.8`, its HTTP part)."""
    if size < POOLED_BODY_BYTES or len(chunks) < 2:
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)
    body = memoryview(pa.allocate_buffer(size)).cast("B")  # unsigned: it compares and slices as `bytes` do
    at = 0
    for chunk in chunks:
        body[at : at + len(chunk)] = chunk
        at += len(chunk)
    return body


def _decompress(body: bytes, encoding: str, limit: int) -> bytes:
    """Inflate with a bound on the output, so a small bomb cannot take the memory; in time linear in the body's
    size whatever the number of members it holds."""
    if encoding in ("", "identity"):
        return body
    if encoding in ("gzip", "x-gzip"):
        return _inflate_gzip(body, 16 + zlib.MAX_WBITS, limit)
    if encoding == "deflate":
        return _inflate_gzip(body, zlib.MAX_WBITS, limit)
    if encoding == "zstd":
        return _inflate_zstd(body, limit)
    raise LookupError(encoding)


_MESSAGE_CHARS = 1000


def _one_line(message: str) -> str:
    """A message safe for a log line and a Status: one line, not too long (a parser's message may quote the
    request's values), and encodable (a lone surrogate of the request's text would fail serializing the Status)."""
    line = " ".join(message.encode("utf-8", "backslashreplace").decode("utf-8").split())
    return line if len(line) <= _MESSAGE_CHARS else line[: _MESSAGE_CHARS - 1] + "…"


def _answer_media(content_type: str) -> str:
    """The encoding of an error answer: the request's, JSON when it is neither protobuf nor JSON."""
    media = _media_type(content_type)
    return media if media in (PROTOBUF, JSON) else JSON


def otlp_refusal(scope: dict[str, Any], message: str) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    """A 401 for a request without a valid API key: a `google.rpc.Status` (UNAUTHENTICATED) in the request's
    encoding, as every error on this port."""
    headers = dict(scope.get("headers", ()))
    media = _answer_media(headers.get(b"content-type", b"").decode("latin-1"))
    body = encode(status_message(HTTP_TO_CODE[401], message), media)
    return 401, [(b"content-type", media.encode())], body


Asgi = Callable[[dict[str, Any], Any, Any], Awaitable[None]]


def build_app(
    export: Export, routes: dict[str, Codec], *, max_body: int, drain: Drain, limits: ReceiverLimits | None = None
) -> Asgi:
    """One POST endpoint per signal path (e.g. /v1/traces, /v1/logs). Every other answer is an error with a
    `google.rpc.Status` body in the request's encoding too: 404 for another path, 405 for another method, and 503
    with `Retry-After` once `drain` is closing. `max_body` bounds the body before and after decompression; the
    codecs apply `limits` (by default those of the receiver `export` belongs to) to what a body holds."""
    limits = limits if limits is not None else ReceiverLimits()
    routes = {path: limits.apply(codec) for path, codec in routes.items()}
    # threads are started on first use and end with the process (or the app, when it is collected)
    executor = ThreadPoolExecutor(DECODE_THREADS, thread_name_prefix="otlp-http-decode")
    served = ", ".join(routes)

    async def off_loop(fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(executor, fn, *args)

    def error(
        status: int, message: str, media: str, *, retry_after: float | None = None, violation: Violation | None = None
    ) -> Response:
        message = _one_line(message)
        if status in (400, 413):  # the sender's data is refused for good: say so once, on one line
            logger.warning("refused an OTLP/HTTP request (%d): %s", status, message)
        if violation is not None:
            violation = replace(violation, description=_one_line(violation.description))
        body = encode(status_message(HTTP_TO_CODE[status], message, retry_after, violation), media)
        headers = {"Retry-After": str(max(1, round(retry_after)))} if retry_after is not None else None
        return Response(body, status_code=status, media_type=media, headers=headers)

    def bad_request(message: str, media: str, reason: str, field: str = "") -> Response:
        return error(400, message, media, violation=Violation(reason, message, field))

    async def receive(request: Request, codec: Codec) -> Response:
        media = _media_type(request.headers.get("content-type", ""))
        if media not in (PROTOBUF, JSON):
            return error(
                415,
                f"unsupported content type {media or '(none)'!r}; send {PROTOBUF} or {JSON}",
                JSON,
            )
        declared = request.headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > max_body:
            return error(413, f"request body of {declared} bytes exceeds the limit of {max_body} bytes", media)
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > max_body:
                return error(413, f"request body exceeds the limit of {max_body} bytes", media)
            chunks.append(chunk)
        encoding = request.headers.get("content-encoding", "").strip().lower()
        # a protobuf body as it arrived goes to the parser and the workers' pipes, which take any buffer; JSON and
        # compressed bodies are read as `bytes`
        plain = media == PROTOBUF and encoding in ("", "identity")
        body: bytes | memoryview = _joined(chunks, size) if plain else b"".join(chunks)
        try:
            if encoding not in ("", "identity"):  # even a small body may inflate to the limit: off the loop
                body = await off_loop(_decompress, body, encoding, max_body)
        except _TooLarge:
            return error(413, f"decompressed body exceeds the limit of {max_body} bytes", media)
        except LookupError:
            message = f"unsupported content encoding {encoding!r}; use gzip, zstd or none"
            return bad_request(message, media, "UNSUPPORTED_CONTENT_ENCODING")
        except (zlib.error, zstandard.ZstdError, ValueError) as e:
            return bad_request(f"body is not valid {encoding}: {e}", media, "INVALID_COMPRESSED_BODY")
        decode = codec.from_json if media == JSON else codec.from_protobuf
        try:
            decoded = await off_loop(decode, body) if len(body) > OFF_LOOP_BYTES else decode(body)
        except OverLimit as e:  # more items than the receiver takes in one request: the sender should split it
            limits.refused(e, "http")
            return bad_request(str(e), media, e.reason, e.field)
        except DecodeFailed as e:
            return bad_request(str(e), media, e.reason, e.field)
        except Exception as e:  # a decoder bug: answered with a Status like any error, and the log says what broke
            logger.exception("decoding failed on a request")
            return error(500, f"internal error decoding the request: {e}", media)
        try:
            await export(codec, decoded, "http", body, media == JSON, request.scope.get(PRINCIPAL_SCOPE_KEY))
        except Refused as r:
            return error(503 if r.unavailable else 429, str(r), media, retry_after=r.retry_after)
        except Exception as e:  # a pipeline bug: the sender must not retry forever, and the log says what broke
            logger.exception("pipeline failed on a batch")
            return error(500, f"internal error in the pipeline: {e}", media)
        return Response(encode(codec.response(decoded.rejected, decoded.message), media), media_type=media)

    async def refuse_while_draining(request: Request, media: str) -> Response:
        # the body is read (and dropped) first: closing a connection with unread data resets it, and the sender
        # could lose the answer that tells it to retry
        size = 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > max_body:
                break
        resp = error(503, SHUTTING_DOWN, media, retry_after=RETRY_AFTER)
        resp.headers["Connection"] = "close"  # the sender reconnects, perhaps to another replica
        return resp

    async def answer(request: Request, media: str) -> Response:
        path = request.scope["path"]
        codec = routes.get(path)
        if codec is None:
            return error(404, f"no OTLP endpoint at {path}; this port serves POST to {served}", media)
        if request.method != "POST":
            resp = error(405, f"method {request.method} not allowed on {path}; use POST", media)
            resp.headers["Allow"] = "POST"
            return resp
        if not drain.admit():
            return await refuse_while_draining(request, media)
        try:
            return await receive(request, codec)
        finally:
            drain.release()

    async def app(scope: dict[str, Any], receive_: Any, send: Any) -> None:
        if scope["type"] != "http":
            if scope["type"] == "websocket":
                await send({"type": "websocket.close", "code": 1008})
            return
        request = Request(scope, receive_)
        media = _answer_media(request.headers.get("content-type", ""))
        try:
            response = await answer(request, media)
        except ClientDisconnect:
            return  # the sender left before its body arrived: no one to answer
        except Exception as e:  # a bug here: still a Status, and the log says what broke
            logger.exception("answering an OTLP/HTTP request failed")
            response = error(500, f"internal error: {e}", media)
        await response(scope, receive_, send)

    return app
