"""The check of a request's credential (`Authorization: Bearer <API key or JWT>`): an API key against the configured
hashes, a JWT against the issuer's keys; who it is (`Principal`) or why it is refused (`Refusal`), counted."""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from evalsi.auth.config import AuthConfig, is_loopback
from evalsi.auth.jwks import Jwks
from evalsi.auth.keys import HASH_PREFIX
from evalsi.auth.principal import ANONYMOUS, ANONYMOUS_PRINCIPAL, PROJECT_PATTERN, Caller, Principal, Refusal, Surface

if TYPE_CHECKING:
    from evalsi.runtime.telemetry import SelfMetrics


def _is_jwt(token: str) -> bool:
    """Whether a bearer value is a JWT (three base64url parts) rather than an API key (`evk_…`, no dots)."""
    return token.count(".") == 2


class Authenticator:
    """Checks the `Authorization: Bearer <credential>` of a request: an API key against the configured hashes, a JWT
    against the issuer's keys (`auth.jwt`); `identify` says who it is."""

    def __init__(
        self, config: AuthConfig, metrics: SelfMetrics | None = None, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.config = config
        self._keys = {
            bytes.fromhex(k.hash.removeprefix(HASH_PREFIX)): Principal(
                k.name or k.hash[: len(HASH_PREFIX) + 12], k.project, "api_key"
            )
            for k in config.api_keys
        }
        self.jwks = Jwks(config.jwt, clock) if config.jwt is not None and self.enabled else None
        self._refused = (
            metrics.counter(
                "evalsi_auth_refused_requests",
                "Requests refused for their credentials, by listener (otlp_http, otlp_grpc, api, metrics, "
                "prometheus) and reason (missing, malformed, unknown key; for a JWT invalid, expired, not_yet_valid, "
                "wrong_audience, wrong_issuer, missing_claim, algorithm_not_allowed, unknown_kid, jwks_unavailable, "
                "no_project, bad_project).",
                ["surface", "reason"],
            )
            if metrics is not None
            else None
        )
        self._anonymous = (
            metrics.counter(
                "evalsi_auth_anonymous_requests",
                "Requests taken without a key (mode optional), by listener: what still needs a key before strict.",
                ["surface"],
            )
            if metrics is not None
            else None
        )

    @property
    def enabled(self) -> bool:
        return self.config.mode != "none"

    def needs_key(self, surface: Surface, endpoint: str) -> bool:
        if surface == "metrics":
            return self.enabled and self.config.metrics == "protected" and not is_loopback(endpoint)
        return self.enabled

    def identify(self, authorization: str | None, surface: str | None = None) -> Principal:
        """The principal of a request with this `Authorization` value (`Bearer <API key or JWT>`); raises `Refusal`.
        `surface` names the listener in the refusal and anonymous counts (left out, the request is not counted: it
        was counted where it came in). Mode none: everyone is anonymous."""
        try:
            principal = self._identify(authorization)
        except Refusal as e:
            if self._refused is not None and surface is not None:
                self._refused.labels(surface, e.reason).inc()
            raise
        if principal.via == "anonymous" and self._anonymous is not None and surface is not None and self.enabled:
            self._anonymous.labels(surface).inc()
        return principal

    async def identify_async(self, authorization: str | None, surface: str | None = None) -> Principal:
        """`identify` for an event loop: a check that would load the issuer's keys (an HTTP request) runs in a
        thread."""
        if self.jwks is not None and authorization and self.jwks.due(self._kid_of(authorization)):
            return await asyncio.to_thread(self.identify, authorization, surface)
        return self.identify(authorization, surface)

    def check(self, authorization: str | None, surface: str = "") -> Caller:
        """The caller of a request with this `Authorization` value; raises `Unauthenticated` (a `Refusal`).
        `surface` names the listener in the refusal counts. Kept for callers that need no project: see `identify`."""
        principal = self.identify(authorization, surface)
        if principal.via == "anonymous":
            return ANONYMOUS
        return Caller(principal.name, authenticated=True)

    def _credentials(self) -> tuple[str, str, str]:
        """What this collector takes: in words, as an example header value, and as the header's form."""
        if self.jwks is None:
            return "an API key", "Bearer evk_…", "Bearer <API key>"
        if not self._keys:
            return "a token (JWT)", "Bearer <JWT>", "Bearer <JWT>"
        return "an API key or a token (JWT)", "Bearer evk_…` or `Bearer <JWT>", "Bearer <API key or JWT>"

    def _identify(self, authorization: str | None) -> Principal:
        if not self.enabled:
            return ANONYMOUS_PRINCIPAL
        if not authorization:
            if self.config.mode == "strict":
                words, example, _ = self._credentials()
                raise Refusal("missing", f"this endpoint needs {words}: send `Authorization: {example}`")
            return ANONYMOUS_PRINCIPAL
        scheme, _, token = authorization.strip().partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise Refusal("malformed", f"the Authorization header must be `{self._credentials()[2]}`")
        if self.jwks is not None and _is_jwt(token):
            return self._from_jwt(token)
        # a lookup by the key's digest: comparing digests leaks nothing useful about the key through timing
        principal = self._keys.get(hashlib.sha256(token.encode()).digest())
        if principal is None:
            if not self._keys and self.jwks is not None:
                raise Refusal("unknown key", "this collector takes tokens (JWT) only, and the bearer value is not one")
            raise Refusal("unknown key", "the API key is not valid here: check it, or ask for one (`evalsi keys new`)")
        return principal

    @staticmethod
    def _kid_of(authorization: str) -> str | None:
        import jwt

        _, _, token = authorization.strip().partition(" ")
        token = token.strip()
        if not _is_jwt(token):
            return None
        try:
            kid = jwt.get_unverified_header(token).get("kid")
        except jwt.PyJWTError:
            return None
        return kid if isinstance(kid, str) else None

    def _from_jwt(self, token: str) -> Principal:
        import jwt
        from jwt import exceptions as e

        config = self.config.jwt
        assert config is not None and self.jwks is not None
        try:
            header = jwt.get_unverified_header(token)
        except e.PyJWTError:
            raise Refusal("invalid", "the bearer token is not a well-formed JWT") from None
        alg, kid = header.get("alg"), header.get("kid")
        if alg not in config.algorithms:
            raise Refusal(
                "algorithm_not_allowed",
                f"the token's signature algorithm is not taken here (taken: {', '.join(config.algorithms)})",
            )
        if kid is not None and not isinstance(kid, str):
            raise Refusal("invalid", "the token's `kid` is not a string")
        key = self.jwks.find(kid, alg)
        try:
            claims = jwt.decode(
                token, key, algorithms=config.algorithms, audience=config.audience, issuer=config.issuer,
                leeway=config.leeway, options={"require": ["exp", "iss", "aud"]},
            )  # fmt: skip
        except e.ExpiredSignatureError:
            raise Refusal("expired", "the token has expired: get a new one from its issuer") from None
        except e.MissingRequiredClaimError as missing:
            raise Refusal("missing_claim", f"the token has no `{missing.claim}` claim, which evalsi requires") from None
        except e.InvalidAudienceError:
            raise Refusal("wrong_audience", "the token was not issued for this collector (its `aud`)") from None
        except e.InvalidIssuerError:
            raise Refusal(
                "wrong_issuer", "the token is not from the issuer this collector trusts (its `iss`)"
            ) from None
        except e.ImmatureSignatureError:
            raise Refusal("not_yet_valid", "the token is not valid yet (its `nbf` or `iat`)") from None
        except (e.PyJWTError, ValueError, TypeError):
            raise Refusal("invalid", "the token's signature or claims are not valid") from None
        name = claims.get(config.name_claim)
        if not isinstance(name, str) or not name:
            raise Refusal("missing_claim", f"the token has no `{config.name_claim}` claim naming who holds it")
        project = claims.get(config.project_claim)
        if project is None:
            if config.default_project is None:
                raise Refusal(
                    "no_project",
                    f"the token has no `{config.project_claim}` claim naming its project (and no "
                    "`auth.jwt.default_project` is set)",
                )
            project = config.default_project
        if not isinstance(project, str) or not PROJECT_PATTERN.fullmatch(project):
            raise Refusal(
                "bad_project",
                f"the token's `{config.project_claim}` claim is not a project name (lowercase letters, digits, `_`, "
                "`-`)",
            )
        return Principal(name, project, "jwt")
