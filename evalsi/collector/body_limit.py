"""The API's request bodies: how large one may be (413 past its route's limit) and whether the collector's memory
takes it (503 while a memory_limiter refuses), for every route of the API, those added later too.

The size rule is the OTLP/HTTP receiver's: a declared Content-Length past the limit is refused before a byte is
read; a body without one (chunked) is read until it passes the limit, then refused, so no body is ever held past
its limit. A body within it is read here, whole, and handed to the route as it came.

A request that takes a body (POST, PUT, PATCH, or any that carries one) first asks each memory_limiter
(`BodyAdmitter`) whether its body may be read: refused with 503 and `Retry-After` while memory is above the soft
limit, or while the body would take it past the hard limit. What a guard admitted counts until the answer is sent.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from evalsi.capabilities import BodyAdmitter
from evalsi.component import Refused

logger = logging.getLogger("evalsi.api")

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
Asgi = Callable[[Scope, Receive, Send], Awaitable[None]]

BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
"""The methods whose routes take a body: asked of the memory guards even when the request declares none."""


@dataclass(frozen=True)
class BodyLimit:
    size: int
    """Bytes a request body may have."""
    key: str
    """The config key that sets it, which a refusal names."""


class _Admitted:
    """What the guards admitted for one request, released together."""

    def __init__(self, guards: Sequence[BodyAdmitter]) -> None:
        self.guards = guards
        self.size = 0

    def admit(self, size: int) -> None:
        """Every guard admits `size` more bytes, or none does (`Refused` from the first that refuses)."""
        done: list[BodyAdmitter] = []
        try:
            for guard in self.guards:
                guard.admit_body(size)
                done.append(guard)
        except Refused:
            for guard in done:
                guard.release_body(size)
            raise
        self.size += size

    def release(self) -> None:
        for guard in self.guards:
            guard.release_body(self.size)
        self.size = 0


def _framing(scope: Scope) -> tuple[int | None, bool]:
    """The declared Content-Length (None: none, or not a number, which the server refuses itself) and whether
    the body is chunked."""
    declared, chunked = None, False
    for name, value in scope.get("headers", ()):
        if name == b"content-length" and value.strip().isdigit():
            declared = int(value)
        elif name == b"transfer-encoding":
            chunked = True
    return declared, chunked


async def _answer(send: Send, status: int, doc: dict[str, Any], headers: Sequence[tuple[bytes, bytes]] = ()) -> None:
    body = json.dumps(doc).encode()
    await send({
        "type": "http.response.start", "status": status,
        "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), *headers],
    })  # fmt: skip
    await send({"type": "http.response.body", "body": body})


def too_large_message(scope: Scope, limit: BodyLimit, declared: int | None) -> str:
    size = f"of {declared} bytes " if declared is not None else ""
    return (
        f"request body {size}exceeds the limit of {limit.size} bytes for {scope.get('method', '')} "
        f"{scope.get('path', '')}; split it, or raise {limit.key} in the collector's config"
    )


def _replay(body: bytes, receive: Receive) -> Receive:
    """The body read here, as one message; then the server's own messages (a disconnect)."""
    sent = False

    async def replayed() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replayed


def limit_bodies(app: Asgi, limit_of: Callable[[Scope], BodyLimit], guards: Sequence[BodyAdmitter] = ()) -> Asgi:
    """`app` behind the body limits: `limit_of(scope)` is the limit of the route a request goes to; `guards` are
    the collector's memory_limiters."""

    async def too_large(scope: Scope, send: Send, limit: BodyLimit, declared: int | None) -> None:
        message = too_large_message(scope, limit, declared)
        logger.warning("refused an API request (413): %s", message)
        await _answer(send, 413, {"detail": message, "status": 413, "limit": limit.size, "key": limit.key})

    async def refused(send: Send, r: Refused) -> None:
        status = 503 if r.unavailable else 429
        retry_after = str(max(1, math.ceil(r.retry_after)))
        await _answer(send, status, {"detail": str(r), "status": status}, [(b"retry-after", retry_after.encode())])

    async def limited(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        declared, chunked = _framing(scope)
        if scope["method"] not in BODY_METHODS and not declared and not chunked:
            await app(scope, receive, send)  # no body to read
            return
        limit = limit_of(scope)
        if declared is not None and declared > limit.size:
            await too_large(scope, send, limit, declared)
            return
        admitted = _Admitted(guards)
        try:
            try:
                admitted.admit(declared or 0)
            except Refused as r:
                await refused(send, r)
                return
            chunks, size = [], 0
            while True:
                message = await receive()
                if message["type"] != "http.request":
                    return  # the client left: no one to answer
                chunk = message.get("body", b"")
                size += len(chunk)
                if size > limit.size:
                    del chunks
                    await too_large(scope, send, limit, None)
                    return
                if size > admitted.size:  # past what it declared (or nothing declared): asked as it comes
                    try:
                        admitted.admit(size - admitted.size)
                    except Refused as r:
                        del chunks
                        await refused(send, r)
                        return
                if chunk:
                    chunks.append(chunk)
                if not message.get("more_body", False):
                    break
            body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
            del chunks
            await app(scope, _replay(body, receive), send)
        finally:
            admitted.release()

    return limited
