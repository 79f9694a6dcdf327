"""The issuer's public keys (a JWKS, from a file or a URL) that JWT bearer tokens are checked against: read, checked
(public signing keys only), and loaded again when due."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from evalsi.auth.keys import without_password
from evalsi.auth.principal import Refusal

log = logging.getLogger("evalsi.auth")

JWKS_MIN_INTERVAL = 60.0
"""Seconds between two loads of the JWKS at least, whatever asks for one (its refresh, a token with a new `kid`, a
load that failed)."""
JWKS_MAX_BYTES = 1 << 20
JWKS_TIMEOUT = 5.0


def parse_jwks(doc: Any) -> list[dict[str, Any]]:
    """The signing keys of a JWKS document (`{"keys": [...]}`), as JWK objects evalsi can check a signature with;
    a ValueError saying what is wrong (a private or symmetric key, no usable key)."""
    from jwt import PyJWK
    from jwt.exceptions import PyJWTError

    if not isinstance(doc, dict) or not isinstance(doc.get("keys"), list):
        raise ValueError('not a JWKS: a JSON object with a "keys" list')
    usable = []
    for i, jwk in enumerate(doc["keys"]):
        if not isinstance(jwk, dict):
            raise ValueError(f"key {i} is not a JSON object")
        if jwk.get("kty") == "oct":
            raise ValueError(f"key {i} is symmetric (kty oct): list the issuer's public keys only")
        if any(part in jwk for part in ("d", "p", "q")):
            raise ValueError(f"key {i} holds a private key: list the issuer's public keys only")
        if jwk.get("use", "sig") != "sig":
            continue  # an encryption key
        try:
            PyJWK(jwk)  # type: ignore[arg-type]
        except PyJWTError:
            continue  # a key type this evalsi cannot check (the issuer may publish several)
        usable.append(jwk)
    if not usable:
        raise ValueError("holds no signing key evalsi can use (RSA, EC or Ed25519 public keys)")
    return usable


def read_jwks_file(path: Path) -> list[dict[str, Any]]:
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ValueError(f"{path} does not exist") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"{path} cannot be read: {type(e).__name__}: {e}") from None
    try:
        doc = json.loads(text)
    except ValueError as e:
        raise ValueError(f"{path} is not JSON ({e})") from None
    try:
        return parse_jwks(doc)
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None


@dataclass
class _KeySet:
    keys: list[dict[str, Any]]
    by_kid: dict[str, dict[str, Any]] = field(default_factory=dict)
    prepared: dict[tuple[int, str], Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for jwk in self.keys:
            if isinstance(jwk.get("kid"), str):
                self.by_kid.setdefault(jwk["kid"], jwk)

    def key(self, jwk: dict[str, Any], alg: str) -> Any:
        """`jwk` as the PyJWK that checks an `alg` signature: its own `alg` when it names one (a mismatch is refused),
        else `alg` (an RSA key serves RS* and PS* alike)."""
        from jwt import PyJWK
        from jwt.exceptions import PyJWTError

        slot = (id(jwk), alg)
        if slot not in self.prepared:
            try:
                self.prepared[slot] = PyJWK(jwk) if "alg" in jwk else PyJWK(jwk, algorithm=alg)  # type: ignore[arg-type]
            except PyJWTError:
                self.prepared[slot] = PyJWK(jwk)  # type: ignore[arg-type]  # parsed once already: the alg did not fit
        return self.prepared[slot]


class JwksSource(Protocol):
    """Where the issuer's keys come from and how often they are loaded again: `auth.jwt` (`JwtConfig`)."""

    @property
    def jwks_file(self) -> Path | None: ...

    @property
    def jwks_url(self) -> str | None: ...

    @property
    def jwks_refresh(self) -> float: ...


class Jwks:
    """The issuer's public keys (`auth.jwt.jwks_file` or `jwks_url`): loaded at first use, again every
    `jwks_refresh` and when a token names a key (`kid`) they lack; at most once a minute whatever asks. A load that
    fails keeps the keys there were (and is logged)."""

    def __init__(self, config: JwksSource, clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self.clock = clock
        self.source = str(config.jwks_file) if config.jwks_file is not None else without_password(config.jwks_url or "")
        self.loads = 0
        """Loads that succeeded (for tests and logs)."""
        self._lock = threading.Lock()
        self._set: _KeySet | None = None
        self._loaded_at = 0.0
        self._tried_at: float | None = None

    def due(self, kid: str | None) -> bool:
        """Whether finding `kid` would load the keys now (a file read or an HTTP request)."""
        now = self.clock()
        if self._tried_at is not None and now - self._tried_at < JWKS_MIN_INTERVAL:
            return False
        keys = self._set
        if keys is None or now - self._loaded_at >= self.config.jwks_refresh:
            return True
        return kid is not None and kid not in keys.by_kid

    def find(self, kid: str | None, alg: str) -> Any:
        """The key (a PyJWK) that checks a token naming `kid`, signed with `alg`; raises `Refusal`."""
        if self.due(kid):
            with self._lock:
                if self.due(kid):
                    self._load()
        keys = self._set
        if keys is None:
            raise Refusal("jwks_unavailable", "the issuer's signing keys could not be loaded: try again in a minute")
        if kid is None:
            if len(keys.keys) != 1:
                raise Refusal("unknown_kid", "the token names no signing key (`kid`) and the issuer has several")
            return keys.key(keys.keys[0], alg)
        jwk = keys.by_kid.get(kid)
        if jwk is None:
            raise Refusal("unknown_kid", "the token is signed with a key (its `kid`) the issuer does not list")
        return keys.key(jwk, alg)

    def _load(self) -> None:
        self._tried_at = self.clock()
        try:
            if self.config.jwks_file is not None:
                keys = read_jwks_file(self.config.jwks_file)
            else:
                keys = parse_jwks(json.loads(self._fetch(self.config.jwks_url or "")))
        except (ValueError, OSError) as e:  # `_fetch` turns httpx's errors into ValueErrors
            log.warning(
                "could not load the JWKS; keeping the keys loaded before (if any)",
                extra={"source": self.source, "error": str(e)[:300], "had_keys": self._set is not None},
            )
            return
        self._set = _KeySet(keys)
        self._loaded_at = self._tried_at
        self.loads += 1
        log.info("JWKS loaded", extra={"source": self.source, "keys": len(keys)})

    @staticmethod
    def _fetch(url: str) -> bytes:
        import httpx

        try:
            with httpx.Client(timeout=JWKS_TIMEOUT, follow_redirects=False) as client, client.stream("GET", url) as r:
                if r.status_code != 200:
                    raise ValueError(f"HTTP {r.status_code}")
                body = b""
                for chunk in r.iter_bytes():
                    body += chunk
                    if len(body) > JWKS_MAX_BYTES:
                        raise ValueError(f"larger than {JWKS_MAX_BYTES} bytes")
                return body
        except httpx.HTTPError as e:
            raise ValueError(f"{type(e).__name__}: {e}") from None
