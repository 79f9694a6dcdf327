"""Sessions across replicas, in one process (`OwnedSessions` over the real chDB store): three replicas each receive
some turns of a ten-turn session; only its owner evaluates it, over every turn the store holds, once it is quiet on
every replica. A replica leaving the membership hands its sessions over: evaluated once, neither lost nor doubled
(and a session two owners evaluate during the change keeps one score per key in the store)."""

from __future__ import annotations

import logging
import time
import zlib
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from evalsi.component import Settings
from evalsi.exporters.clickhouse.backend import ChdbBackend
from evalsi.exporters.clickhouse.store import TraceStore
from evalsi.model.score import Score
from evalsi.model.span import Span
from evalsi.policies import PolicySet, load_policies
from evalsi.processors.evaluate.owned_sessions import OwnedSessions
from evalsi.replicas import Membership, ReplicasConfig
from evalsi.runtime.telemetry import SelfMetrics

POLICY = """
apiVersion: evals.si/v1alpha1
kind: OnlineEvalPolicy
metadata: {name: conversations}
spec:
  cascade:
    - ref: builtin/session-turns
      params: {max_turns: 12}
"""
NAMES = ("10.0.0.1", "10.0.0.2", "10.0.0.3")
TIMEOUT_S = 30.0
T0 = 1_790_000_000 * 10**9


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TraceStore]:
    opened = TraceStore(ChdbBackend(str(tmp_path_factory.mktemp("sessions") / "store")))
    opened.create_schema()
    yield opened
    opened.close()


@pytest.fixture(scope="module")
def policies(tmp_path_factory: pytest.TempPathFactory) -> PolicySet:
    folder = tmp_path_factory.mktemp("policies")
    (folder / "conversations.yaml").write_text(POLICY)
    return load_policies(["conversations.yaml"], folder)


class Replica:
    """One replica's session ownership, as the evaluate processor wires it, evaluating with real policies and
    writing the scores to the shared store; `members` is what its DNS name resolves to now."""

    def __init__(self, name: str, store: TraceStore, policies: PolicySet, members: list[str]) -> None:
        self.members = members
        config = ReplicasConfig.model_validate({"self": name, "dns": "evalsi-headless", "session_timeout": TIMEOUT_S})
        self.membership = Membership(config, resolve=lambda _: list(self.members))
        self.membership.refresh()
        self.evaluated: list[list[Score]] = []
        self.held: list[Callable[[], None]] = []  # evaluations whose scores are not handed on yet
        self.hold = False
        settings = Settings(id="evaluate", metrics=SelfMetrics(), logger=logging.getLogger("test"))

        def evaluate(spans: list[Span], done: Callable[[], None]) -> None:
            scores = policies.evaluate_session(spans)
            store.write_scores(scores)
            self.evaluated.append(scores)
            if self.hold:
                self.held.append(done)
            else:
                done()

        self.sessions = OwnedSessions(config, self.membership, lambda: store, evaluate, settings)

    def resolve(self, members: list[str]) -> None:
        self.members = members
        self.membership.refresh()


def _turn(session: str, n: int) -> list[Span]:
    trace = f"{0x5E55 << 64 | zlib.crc32(session.encode()) << 8 | n:032x}"
    root = Span(trace, f"{n + 1:016x}", "", "chat", "SERVER", T0 + n * 10**9, T0 + n * 10**9 + 5 * 10**8)
    tool = Span(trace, f"{n + 1:08x}{n + 1:08x}", root.span_id, "tool", "INTERNAL", root.start_time_unix_nano + 1,
                root.start_time_unix_nano + 2)  # fmt: skip
    root.session_id = session
    return [root, tool]


def _receive(replicas: list[Replica], store: TraceStore, session: str, turns: range) -> list[str]:
    """Each turn reaches the replica its trace id routes to (the tier hashes trace ids); it is stored and noted."""
    traces = []
    for n in turns:
        spans = _turn(session, n)
        replicas[n % len(replicas)].sessions.note(spans)
        store.write(spans)
        traces.append(spans[0].trace_id)
    for r in replicas:
        r.sessions.flush()
    return traces


def _tick(replicas: list[Replica], *, after_s: float) -> None:
    now = time.time_ns() + int(after_s * 1e9)
    for r in replicas:
        r.sessions.tick(now_ns=now)


def _stored(store: TraceStore, session: str) -> list[dict[str, Any]]:
    return [s for s in store.session_scores(session) if s["name"] == "session-turns"]


def _evaluations(replica: Replica, session: str) -> list[Score]:
    """The scores of each evaluation of `session` this replica made (the store holds other tests' sessions too)."""
    return [e[0] for e in replica.evaluated if e and e[0].session_id == session]


def _owner(replicas: list[Replica], session: str) -> Replica:
    [owner] = [r for r in replicas if r.membership.owns("default", session)]
    return owner


def test_the_owner_evaluates_a_session_spread_over_three_replicas_once_it_is_quiet(
    store: TraceStore, policies: PolicySet
) -> None:
    replicas = [Replica(n, store, policies, list(NAMES)) for n in NAMES]
    traces = _receive(replicas, store, "conv-spread", range(10))
    _tick(replicas, after_s=TIMEOUT_S / 2)  # not quiet yet
    assert [_evaluations(r, "conv-spread") for r in replicas] == [[], [], []]
    _tick(replicas, after_s=TIMEOUT_S + 1)
    owner = _owner(replicas, "conv-spread")
    assert [len(_evaluations(r, "conv-spread")) for r in replicas] == [1 if r is owner else 0 for r in replicas]
    [turns] = _evaluations(owner, "conv-spread")
    assert (turns.value, turns.passed, turns.trace_id) == (10, True, traces[0])  # every turn, from the first trace
    _tick(replicas, after_s=TIMEOUT_S + 2)  # evaluated: not again
    assert sum(len(_evaluations(r, "conv-spread")) for r in replicas) == 1
    [stored] = _stored(store, "conv-spread")
    assert (stored["value"], stored["trace_id"], stored["session_id"]) == (10, traces[0], "conv-spread")


def test_a_session_whose_owner_leaves_before_it_is_quiet_is_evaluated_once_by_the_new_owner(
    store: TraceStore, policies: PolicySet
) -> None:
    replicas = [Replica(n, store, policies, list(NAMES)) for n in NAMES]
    _receive(replicas, store, "conv-handed", range(6))
    leaving = _owner(replicas, "conv-handed")
    staying = [r for r in replicas if r is not leaving]
    for r in replicas:  # the leaving replica's pod is gone from the headless Service
        r.resolve([n for n in NAMES if n != leaving.membership.me])
    _receive(staying, store, "conv-handed", range(6, 10))  # the tier routes the rest to the two left
    _tick(replicas, after_s=TIMEOUT_S + 1)
    assert _evaluations(leaving, "conv-handed") == []
    assert [s.value for r in staying for s in _evaluations(r, "conv-handed")] == [10]
    assert [s["value"] for s in _stored(store, "conv-handed")] == [10]


def test_a_session_evaluated_before_its_owner_leaves_is_not_evaluated_again(
    store: TraceStore, policies: PolicySet
) -> None:
    replicas = [Replica(n, store, policies, list(NAMES)) for n in NAMES]
    _receive(replicas, store, "conv-done", range(10))
    _tick(replicas, after_s=TIMEOUT_S + 1)
    leaving = _owner(replicas, "conv-done")
    assert len(_evaluations(leaving, "conv-done")) == 1
    leaving.sessions.flush()  # its record that the session was evaluated
    for r in replicas:
        r.resolve([n for n in NAMES if n != leaving.membership.me])
    _tick(replicas, after_s=TIMEOUT_S + 2)
    assert sum(len(_evaluations(r, "conv-done")) for r in replicas) == 1


def test_a_session_two_owners_evaluate_during_a_change_keeps_one_score_per_key(
    store: TraceStore, policies: PolicySet
) -> None:
    """The old owner evaluated it but its scores were not yet handed on (so not recorded evaluated) when it left:
    the new owner evaluates it too. The two writes have the same score key; the store keeps one."""
    replicas = [Replica(n, store, policies, list(NAMES)) for n in NAMES]
    _receive(replicas, store, "conv-twice", range(10))
    old = _owner(replicas, "conv-twice")
    old.hold = True
    _tick(replicas, after_s=TIMEOUT_S + 1)
    for r in replicas:
        r.resolve([n for n in NAMES if n != old.membership.me])
    _tick(replicas, after_s=TIMEOUT_S + 2)
    new = _owner(replicas, "conv-twice")
    [by_old], [by_new] = _evaluations(old, "conv-twice"), _evaluations(new, "conv-twice")
    assert by_old.key == by_new.key
    for done in old.held:
        done()
    assert [s["value"] for s in _stored(store, "conv-twice")] == [10]


def test_a_replica_seeing_more_turns_after_the_evaluation_has_the_whole_session_evaluated_again(
    store: TraceStore, policies: PolicySet
) -> None:
    replicas = [Replica(n, store, policies, list(NAMES)) for n in NAMES]
    _receive(replicas, store, "conv-later", range(4))
    _tick(replicas, after_s=TIMEOUT_S + 1)
    for r in replicas:
        r.sessions.flush()
    _receive(replicas, store, "conv-later", range(4, 7))  # the conversation goes on after a pause
    _tick(replicas, after_s=TIMEOUT_S + 3)
    owner = _owner(replicas, "conv-later")
    assert [s.value for s in _evaluations(owner, "conv-later")] == [4, 7]
    assert [s["value"] for s in _stored(store, "conv-later")] == [7]  # the same key: the whole session replaces it


def test_the_owner_waits_for_turns_noted_but_not_yet_in_the_store(store: TraceStore, policies: PolicySet) -> None:
    """A replica's span writes may lag behind its activity record: the owner evaluates once the store holds as many
    traces as the replicas completed, or after another session_timeout with what it holds."""
    replicas = [Replica(n, store, policies, list(NAMES)) for n in NAMES]
    late = [_turn("conv-lag", n) for n in (8, 9)]
    for n in (8, 9):
        replicas[n % 3].sessions.note(late[n - 8])
    _receive(replicas, store, "conv-lag", range(8))
    _tick(replicas, after_s=TIMEOUT_S + 1)
    owner = _owner(replicas, "conv-lag")
    assert _evaluations(owner, "conv-lag") == []  # 8 of 10 stored: not yet
    for spans in late:
        store.write(spans)
    _tick(replicas, after_s=TIMEOUT_S + 2)
    assert [s.value for s in _evaluations(owner, "conv-lag")] == [10]

    replicas[0].sessions.note(_turn("conv-lost", 1))  # noted as stored, never written (the replica died first)
    _receive(replicas, store, "conv-lost", range(2, 4))
    _tick(replicas, after_s=TIMEOUT_S + 1)
    lost_owner = _owner(replicas, "conv-lost")
    assert _evaluations(lost_owner, "conv-lost") == []
    _tick(replicas, after_s=2 * TIMEOUT_S + 1)
    assert [s.value for s in _evaluations(lost_owner, "conv-lost")] == [2]  # what the store holds, after the wait
