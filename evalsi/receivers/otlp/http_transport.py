"""OTLP/HTTP: `POST /v1/traces` in protobuf or JSON, gzip or zstd, answered per the OTLP spec."""

from __future__ import annotations

import asyncio
import logging
import zlib
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import zstandard
from fastapi import FastAPI, Request, Response

from evalsi.component import Refused
from evalsi.receivers.otlp.decode import Codec, Decoded, DecodeFailed
from evalsi.receivers.otlp.status import HTTP_TO_CODE, JSON, PROTOBUF, encode, status_message

logger = logging.getLogger("evalsi.receiver.otlp")

Export = Callable[[Codec, Decoded, str], Awaitable[None]]
T = TypeVar("T")

# Compressed bodies are inflated, and inflated bodies larger than this decoded, in threads, so that a big request
# does not hold the event loop (and every other request, /healthz included) for its whole decoding. Below it the
# thread hop would cost more than it saves.
OFF_LOOP_BYTES = 64 * 1024
# Those threads: their own, not the event loop's default executor, which the API's store queries (/readyz among
# them) share, so a burst of big requests cannot queue those. Decoding holds the GIL: more would not go faster.
DECODE_THREADS = 4

# Each compressed member (gzip member, zlib stream, zstd frame) is fed to its decompressor in slices that start
# this small and double while the member goes on: what a decompressor copies out as `unused_data` is bounded by
# the last slice, so a body of many tiny members costs time linear in its size, not quadratic.
_FIRST_SLICE = 256
_MAX_SLICE = 1 << 20


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
        d = dctx.decompressobj()
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


def build_app(export: Export, routes: dict[str, Codec], *, max_body: int) -> FastAPI:
    """One POST endpoint per signal path (e.g. /v1/traces, /v1/logs); other methods there get 405."""
    app = FastAPI(openapi_url=None, docs_url=None, redoc_url=None)
    # threads are started on first use and end with the process (or the app, when it is collected)
    executor = ThreadPoolExecutor(DECODE_THREADS, thread_name_prefix="otlp-http-decode")

    async def off_loop(fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(executor, fn, *args)

    def error(status: int, message: str, media: str, *, retry_after: float | None = None) -> Response:
        message = _one_line(message)
        if status in (400, 413):  # the sender's data is refused for good: say so once, on one line
            logger.warning("refused an OTLP/HTTP request (%d): %s", status, message)
        body = encode(status_message(HTTP_TO_CODE[status], message, retry_after), media)
        headers = {"Retry-After": str(max(1, round(retry_after)))} if retry_after is not None else None
        return Response(body, status_code=status, media_type=media, headers=headers)

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
        body = b"".join(chunks)
        encoding = request.headers.get("content-encoding", "").strip().lower()
        try:
            if encoding not in ("", "identity"):  # even a small body may inflate to the limit: off the loop
                body = await off_loop(_decompress, body, encoding, max_body)
        except _TooLarge:
            return error(413, f"decompressed body exceeds the limit of {max_body} bytes", media)
        except LookupError:
            return error(400, f"unsupported content encoding {encoding!r}; use gzip, zstd or none", media)
        except (zlib.error, zstandard.ZstdError, ValueError) as e:
            return error(400, f"body is not valid {encoding}: {e}", media)
        decode = codec.from_json if media == JSON else codec.from_protobuf
        try:
            decoded = await off_loop(decode, body) if len(body) > OFF_LOOP_BYTES else decode(body)
        except DecodeFailed as e:
            return error(400, str(e), media)
        except Exception as e:  # a decoder bug: answered with a Status like any error, and the log says what broke
            logger.exception("decoding failed on a request")
            return error(500, f"internal error decoding the request: {e}", media)
        try:
            await export(codec, decoded, "http")
        except Refused as r:
            return error(503 if r.unavailable else 429, str(r), media, retry_after=r.retry_after)
        except Exception as e:  # a pipeline bug: the sender must not retry forever, and the log says what broke
            logger.exception("pipeline failed on a batch")
            return error(500, f"internal error in the pipeline: {e}", media)
        return Response(encode(codec.response(decoded.rejected, decoded.message), media), media_type=media)

    async def wrong_method(request: Request) -> Response:
        resp = error(405, f"method {request.method} not allowed on {request.url.path}; use POST", JSON)
        resp.headers["Allow"] = "POST"
        return resp

    def endpoint_for(codec: Codec) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            return await receive(request, codec)

        return endpoint

    for path, codec in routes.items():
        app.add_api_route(path, endpoint_for(codec), methods=["POST"])
        app.add_api_route(path, wrong_method, methods=["GET", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"])
    return app
