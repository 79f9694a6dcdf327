"""Who a request is from (a `Principal`: who, and which project) and why one is refused (`Refusal`)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from evalsi.model.span import DEFAULT_PROJECT

Surface = Literal["otlp", "api", "metrics"]
"""What a listener serves: OTLP ingest, the query API (evaluate and feedback included), or Prometheus metrics."""

PROJECT_PATTERN = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}$")
"""A project name: lowercase letters, digits, `_` and `-`, starting with a letter or a digit, at most 63 characters."""


@dataclass(frozen=True)
class Principal:
    """Who sent a request and for which project: the key's name (or the token's `name_claim`), the credential's
    project, and what it came with. Anonymous: no credential (mode optional)."""

    name: str
    project: str
    via: Literal["api_key", "jwt", "anonymous"]


ANONYMOUS_PRINCIPAL = Principal("anonymous", DEFAULT_PROJECT, "anonymous")


class Unauthenticated(Exception):
    """A request without a valid key where one is needed; the message says what to send."""


class Refusal(Unauthenticated):
    """A request refused for its credentials: `reason` (a label of `evalsi_auth_refused_requests_total`) and a
    message for the sender, which never quotes the credential.

    Reasons: `missing`, `malformed`, `unknown key` (an API key not listed); for a JWT `invalid` (not a JWT, a bad
    signature), `expired`, `not_yet_valid`, `wrong_audience`, `wrong_issuer`, `missing_claim`,
    `algorithm_not_allowed`, `unknown_kid`, `jwks_unavailable` (the issuer's keys could not be loaded), `no_project`,
    `bad_project`."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class Caller:
    """Who sent a request: the key's name, or anonymous (optional mode, or a listener that needs no key)."""

    name: str = ""
    authenticated: bool = False


ANONYMOUS = Caller()
