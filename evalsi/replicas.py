"""The replica set evalsi runs as behind a trace-id routing tier: its membership (a static list, or a DNS name's A
records resolved periodically, as the tier's `dns` resolver does) and who owns a session (rendezvous hashing)."""

from __future__ import annotations

import hashlib
import logging
import socket
import threading
from collections.abc import Callable

from pydantic import BaseModel, ConfigDict, Field, model_validator

from evalsi.duration import Duration

log = logging.getLogger("evalsi.replicas")


class ReplicasConfig(BaseModel):
    """This evalsi as one replica of several sharing one store: judge budgets are slices of one ledger in the store,
    and a session's session-scope stages run once, in the replica that owns it. Without this block one process owns
    every budget and every session (the single-machine default)."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    self_: str = Field(alias="self", min_length=1)
    """This replica's name as membership lists it: an entry of `static`, or this pod's IP for `dns`
    (`${env:POD_IP}`)."""
    static: list[str] | None = None
    """Every replica's name, this one's included."""
    dns: str | None = None
    """A name whose A records are the replicas (a headless Service: `evalsi-headless.evalsi.svc.cluster.local`),
    resolved every `resolve_interval`."""
    resolve_interval: Duration = Field(5.0, gt=0)
    """How often `dns` is resolved again (the routing tier's `dns` resolver uses 5s)."""
    session_timeout: Duration = Field(300.0, gt=0)
    """A session is evaluated by its owner once no replica has completed a trace of it for this long (tail_sampling's
    `session_timeout` on one machine)."""
    budget_slice: float = Field(0.25, gt=0, le=1)
    """The fraction of what is left of a judge budget a replica claims at a time; past its budget every replica may
    spend at most one slice more than the budget allows (docs/scale-out.md)."""

    @model_validator(mode="after")
    def _one_source(self) -> ReplicasConfig:
        if (self.static is None) == (self.dns is None):
            raise ValueError("give the replica set as one of `static: [names]` or `dns: name`")
        if self.static is not None:
            if not self.static:
                raise ValueError("static: an empty replica set: list every replica's name, this one's included")
            if self.self_ not in self.static:
                raise ValueError(
                    f"static does not list self ({self.self_!r}): this replica would own no session; add it"
                )
        return self


Resolver = Callable[[str], list[str]]


def resolve_a_records(name: str) -> list[str]:
    """The IPv4 addresses `name` resolves to (a headless Service: one per pod)."""
    infos = socket.getaddrinfo(name, None, family=socket.AF_INET, type=socket.SOCK_STREAM)
    return sorted({str(info[4][0]) for info in infos})


def rendezvous_owner(members: tuple[str, ...], project: str, session_id: str) -> str | None:
    """The member with the highest hash of (member, project, session id): every replica that sees the same members
    picks the same owner, and a change of members moves only the sessions of the members that came or went."""
    if not members:
        return None
    key = f"\x00{project}\x00{session_id}".encode()

    def weight(member: str) -> tuple[int, str]:
        digest = hashlib.blake2b(member.encode() + key, digest_size=8).digest()
        return int.from_bytes(digest, "big"), member

    return max(members, key=weight)


class Membership:
    """The current replica set, as this replica sees it. `refresh` resolves `dns` again (a failed resolution keeps
    the last set); a static set never changes."""

    def __init__(self, config: ReplicasConfig, resolve: Resolver = resolve_a_records) -> None:
        self.config = config
        self.me = config.self_
        self._resolve = resolve
        self._lock = threading.Lock()
        self._members: tuple[str, ...] = tuple(sorted(set(config.static or ())))
        self.changes = 0
        """How many times the set changed since start (the first resolution included)."""

    @property
    def members(self) -> tuple[str, ...]:
        with self._lock:
            return self._members

    @property
    def size(self) -> int:
        """Replicas in the set, at least 1 (this one)."""
        return max(1, len(self.members))

    def refresh(self) -> bool:
        """Resolve `dns` again; True when the set changed."""
        if self.config.dns is None:
            return False
        try:
            found = tuple(sorted(set(self._resolve(self.config.dns))))
        except OSError as e:
            log.warning("replicas: cannot resolve %s (%s); keeping %d members", self.config.dns, e, len(self.members))
            return False
        if not found:
            return False
        with self._lock:
            if found == self._members:
                return False
            self._members = found
            self.changes += 1
        if self.me not in found:
            log.warning("replicas: %s resolves to %s, without self (%s): this replica owns no session",
                        self.config.dns, ", ".join(found), self.me)  # fmt: skip
        return True

    def owner(self, project: str, session_id: str) -> str | None:
        return rendezvous_owner(self.members, project, session_id)

    def owns(self, project: str, session_id: str) -> bool:
        return self.owner(project, session_id) == self.me
