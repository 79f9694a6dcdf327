"""API keys: a new one and its hash (the config holds the hash, never the key), the key evalsi's own clients send,
and URLs as they may be logged (a password in them hidden)."""

from __future__ import annotations

import hashlib
import os
import secrets

KEY_PREFIX = "evk_"
HASH_PREFIX = "sha256:"


def new_key() -> tuple[str, str]:
    """A fresh API key and its `sha256:` hash."""
    key = KEY_PREFIX + secrets.token_urlsafe(32)
    return key, hash_of(key)


def hash_of(key: str) -> str:
    return HASH_PREFIX + hashlib.sha256(key.encode()).hexdigest()


KEY_ENV = "EVALSI_API_KEY"


def api_headers() -> dict[str, str]:
    """What evalsi's own clients (the CLI, `evalsi run`) send to a collector: the key in `EVALSI_API_KEY`, if set."""
    key = os.environ.get(KEY_ENV, "").strip()
    return {"Authorization": f"Bearer {key}"} if key else {}


def without_password(url: str) -> str:
    """`url` as it may be logged: a password in it (`scheme://user:password@host`) shown as ***."""
    scheme, sep, rest = url.partition("://")
    userinfo, at, host = rest.rpartition("@") if sep else ("", "", rest)
    if not at or ":" not in userinfo:
        return url
    return f"{scheme}://{userinfo.split(':', 1)[0]}:***@{host}"
