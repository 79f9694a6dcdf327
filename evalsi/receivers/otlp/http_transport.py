"""OTLP/HTTP: `POST /v1/traces` in protobuf or JSON, gzip or zstd, answered per the OTLP spec."""

from __future__ import annotations

import logging
import zlib
from collections.abc import Awaitable, Callable

import zstandard
from fastapi import FastAPI, Request, Response

from evalsi.component import Refused
from evalsi.receivers.otlp.decode import Codec, Decoded, DecodeFailed
from evalsi.receivers.otlp.status import HTTP_TO_CODE, JSON, PROTOBUF, encode, status_message

logger = logging.getLogger("evalsi.receiver.otlp")

Export = Callable[[Codec, Decoded, str], Awaitable[None]]


class _TooLarge(Exception):
    pass


def _media_type(content_type: str) -> str:
    return content_type.split(";", 1)[0].strip().lower()


def _inflate_gzip(body: bytes, wbits: int, limit: int) -> bytes:
    out = bytearray()
    data = body
    while data:  # a body may hold several gzip members (RFC 1952): read them all
        d = zlib.decompressobj(wbits)
        out += d.decompress(data, limit + 1 - len(out))
        if len(out) > limit or d.unconsumed_tail:
            raise _TooLarge
        if not d.eof:
            raise ValueError("truncated compressed body")
        data = d.unused_data
    return bytes(out)


def _inflate_zstd(body: bytes, limit: int) -> bytes:
    # the bounded read across every frame (RFC 8878) stops a bomb; a frame cut short reads as nothing there,
    # so completeness is checked frame by frame on input already known to inflate within the limit
    out = zstandard.ZstdDecompressor().stream_reader(body, read_across_frames=True).read(limit + 1)
    if len(out) > limit:
        raise _TooLarge
    data = body
    while data:
        d = zstandard.ZstdDecompressor().decompressobj()
        d.decompress(data)
        if not d.eof:
            raise ValueError("truncated compressed body")
        data = d.unused_data
    return out


def _decompress(body: bytes, encoding: str, limit: int) -> bytes:
    """Inflate with a bound on the output, so a small bomb cannot take the memory."""
    if encoding in ("", "identity"):
        return body
    if encoding in ("gzip", "x-gzip"):
        return _inflate_gzip(body, 16 + zlib.MAX_WBITS, limit)
    if encoding == "deflate":
        return _inflate_gzip(body, zlib.MAX_WBITS, limit)
    if encoding == "zstd":
        return _inflate_zstd(body, limit)
    raise LookupError(encoding)


def build_app(export: Export, routes: dict[str, Codec], *, max_body: int) -> FastAPI:
    """One POST endpoint per signal path (e.g. /v1/traces, /v1/logs); other methods there get 405."""
    app = FastAPI(openapi_url=None, docs_url=None, redoc_url=None)

    def error(status: int, message: str, media: str, *, retry_after: float | None = None) -> Response:
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
            body = _decompress(body, encoding, max_body)
        except _TooLarge:
            return error(413, f"decompressed body exceeds the limit of {max_body} bytes", media)
        except LookupError:
            return error(400, f"unsupported content encoding {encoding!r}; use gzip, zstd or none", media)
        except (zlib.error, zstandard.ZstdError, ValueError) as e:
            return error(400, f"body is not valid {encoding}: {e}", media)
        try:
            decoded = codec.from_json(body) if media == JSON else codec.from_protobuf(body)
        except DecodeFailed as e:
            return error(400, str(e), media)
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
