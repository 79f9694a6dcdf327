"""An HTTP (ASGI) app behind the credential check: a refused request answered 401, every other one carrying its
`Principal` in its scope."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from typing import Any

from evalsi.auth.authenticator import Authenticator
from evalsi.auth.principal import ANONYMOUS_PRINCIPAL, Refusal

PRINCIPAL_SCOPE_KEY = "evalsi.principal"

RefusalAnswer = Callable[[dict[str, Any], str], tuple[int, list[tuple[bytes, bytes]], bytes]]
"""Builds the 401 a surface answers: (status, headers, body) for the request's scope and the message."""


def json_refusal(scope: dict[str, Any], message: str) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    return 401, [(b"content-type", b"application/json")], json.dumps({"detail": message}).encode()


def gate(
    app: Any, auth: Authenticator | None, *, surface: str, open_paths: Iterable[str] = (),
    refusal: RefusalAnswer = json_refusal,
) -> Any:  # fmt: skip
    """`app` behind a credential check; `open_paths` (health) stay open. Every HTTP request the app sees carries its
    `Principal` in `scope["evalsi.principal"]` (anonymous on an open path, with no `auth`, or in mode none)."""
    if auth is None or not auth.enabled:

        async def anonymous(scope: dict[str, Any], receive: Any, send: Any) -> None:
            if scope.get("type") == "http":
                scope[PRINCIPAL_SCOPE_KEY] = ANONYMOUS_PRINCIPAL
            await app(scope, receive, send)

        return anonymous
    always_open = frozenset(open_paths)

    async def gated(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope.get("type") != "http" or scope.get("path") in always_open:
            if scope.get("type") == "http":
                scope[PRINCIPAL_SCOPE_KEY] = ANONYMOUS_PRINCIPAL
            await app(scope, receive, send)
            return
        header = next((v for k, v in scope.get("headers", ()) if k == b"authorization"), None)
        try:
            principal = await auth.identify_async(header.decode("latin-1") if header is not None else None, surface)
        except Refusal as e:
            status, headers, body = refusal(scope, str(e))
            headers = [*headers, (b"www-authenticate", b'Bearer realm="evalsi"'), (b"content-length",
                       str(len(body)).encode())]  # fmt: skip
            await send({"type": "http.response.start", "status": status, "headers": headers})
            await send({"type": "http.response.body", "body": body})
            return
        scope[PRINCIPAL_SCOPE_KEY] = principal
        await app(scope, receive, send)

    return gated
