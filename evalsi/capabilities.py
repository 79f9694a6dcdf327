"""The optional capabilities of components: what a component may offer the service beyond `start`, `shutdown` and
consuming batches (the Collector's optional interfaces, such as `extension.PipelineWatcher`).

Each capability is a `typing.Protocol`: a component offers it by defining its members, without inheriting from it,
and the service finds it with `isinstance(component, Capability)` when it builds or runs the graph (every Protocol
here is `runtime_checkable` for that; such a check looks for the members by name, not at their signatures, which
`tests/architecture/test_capabilities.py` checks for every built-in component). Each docstring says who calls the
capability, when, and why. The table in docs/architecture.md lists them with their implementers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from evalsi.model.score import Score
from evalsi.model.span import Span

# --- every process: the service's lifecycle -------------------------------------------------------------------------


@runtime_checkable
class Holder(Protocol):
    """A component (or a fan-out, a worker's store link, the worker pool) that holds items between consume calls:
    an event join, a tail-sampling buffer, an exporter's queue.

    `Service.held_since` asks every holder four times a second (and a pipeline worker reports it to the collector),
    so that the write-ahead log deletes only segments whose requests nothing holds any more."""

    def held_since(self) -> float | None:
        """When the oldest item it holds reached a receiver (monotonic); None when it holds none."""
        ...


@runtime_checkable
class ReadinessReporter(Protocol):
    """An exporter that can be unable to take data for a while (its store is down).

    `Service.not_ready` asks every exporter that offers it on each `/readyz` request, so that load balancers send
    elsewhere while it lasts."""

    def not_ready(self) -> str | None:
        """Why it cannot take data now, or None."""
        ...


@runtime_checkable
class LossCounter(Protocol):
    """An exporter, a processor that owes what its next consumer refused (normalize, redact), or the worker pool:
    it can be left holding acknowledged items it could not hand on.

    `Service.unstored` sums them after shutdown, so the stop is logged with what was lost, by kind."""

    unstored: dict[str, int]
    """What it was handed (acknowledged to senders) but could not write before it stopped, by kind."""


@runtime_checkable
class EndpointServer(Protocol):
    """A receiver that listens: the OTLP receiver.

    `Service.status` reads it for the ready line and `/status`, so operators and clients see where it listens (a
    port of 0 is chosen by the system)."""

    endpoints: dict[str, str]
    """Where it listens, by protocol (`grpc`, `http`): `host:port`."""


@runtime_checkable
class Replayer(Protocol):
    """A receiver whose requests the write-ahead log keeps: the OTLP receiver.

    At start, before the receivers listen, `Service._replay` hands each logged request back to the receiver that
    logged it, so what was acknowledged before a crash reaches the pipelines."""

    def protobuf_of(self, signal: str, fmt: str, body: bytes) -> bytes:
        """A request it logged, as protobuf (an OTLP/JSON one re-encoded), so stored spans can be left out of it."""
        ...

    async def replay(self, signal: str, body: bytes, project: str = "") -> None:
        """Hand on a logged request (protobuf) as when it first came, waiting while the pipeline refuses."""
        ...


@runtime_checkable
class Settler(Protocol):
    """A pull receiver: it keeps a watermark of what it has read from its source.

    `Service.shutdown` awaits it after the processors drained and before the exporters stop, so the watermark it
    keeps covers only what the exporters stored, and the next run reads the rest again."""

    async def settle(self, timeout: float) -> None:
        """Wait (up to `timeout` seconds) until the exporters stored what it handed on, then keep its watermark."""
        ...


@runtime_checkable
class PolicyReloader(Protocol):
    """A processor whose policy files can be loaded again while it runs: evaluate.

    `Service.reload` calls it on SIGHUP (a pipeline worker when the collector tells it to), with the policy list of
    the config file as it is now, so policies change without a restart."""

    async def reload(self, policies: list[str] | None = None, base_dir: Path | None = None) -> str:
        """Load the policy files again; raise `ValueError` (the policies in use stay) when one fails. Returns what
        changed, for the log."""
        ...


@runtime_checkable
class MutatesData(Protocol):
    """A consumer that says whether it changes the spans it is handed (the Collector's
    `consumer.Capabilities{MutatesData}`): exporters and the store link say they do not.

    A fan-out (`collector/fanout.py`) reads it for each consumer it hands a batch to: a consumer that mutates gets a
    copy whenever another consumer shares the batch; one that does not gets the batch itself. A consumer that does
    not say (every processor: it hands spans on to the rest of its pipeline) is taken to mutate."""

    mutates_data: bool
    """False: it only reads the spans, also after `consume` returned (an exporter's queue holds them)."""


# --- sessions: built when the graph is built ------------------------------------------------------------------------


@runtime_checkable
class SessionAssembler(Protocol):
    """A processor that assembles sessions from traces: tail_sampling.

    `Service._build` calls it when no processor after it in any traces pipeline is a `SessionEvaluator` that wants
    sessions, so it holds none (each session would only cost memory until it went quiet)."""

    def no_session_consumers(self) -> None:
        """Nothing after it acts on sessions: hold no sessions, hand on no session batches."""
        ...


@runtime_checkable
class SessionEvaluator(Protocol):
    """A processor that may act on the session batches a `SessionAssembler` before it hands on: evaluate.

    `Service._build` reads it to decide whether the assemblers before it keep sessions."""

    @property
    def wants_sessions(self) -> bool:
        """Whether it evaluates session batches (a worker's instance does not: sessions meet in the collector)."""
        ...


@runtime_checkable
class SessionSettings(Protocol):
    """The config of a `SessionAssembler` (tail_sampling's): how it bounds sessions.

    `Service._build` takes them from the assembler before an `EvaluationHub` in its pipeline, so sessions assembled
    in the collector process from every worker's traces are bounded as the pipeline says."""

    session_timeout: float
    max_sessions: int
    max_session_spans: int


# --- with pipeline workers: the collector process's instances (`meets=True`) ----------------------------------------


@runtime_checkable
class EvaluationHub(Protocol):
    """The collector-process instance of a processor whose worker instances evaluate: evaluate (`meets=True`).

    The `WorkerPool` hands it what every worker's instance sends (`WorkerPeers.hand_evaluated`,
    `hand_session_trace`, `hand_twin_trace`), so windows, alerts, sessions and duplicate calls are computed once,
    where every worker's traces meet. `Service._build` calls `meet_sessions` on it."""

    async def take_evaluated(self, scores: list[Score], windows: list[Any]) -> None:
        """A worker's scores (for the scores pipeline) and window records (`WindowRecord`, for the real windows and
        alerts); raise `Refused` while the scores pipeline is behind."""
        ...

    def take_session_trace(self, spans: list[Span]) -> None:
        """A worker's completed trace of a session: held until the session is quiet, then evaluated here."""
        ...

    def take_twin_trace(self, spans: list[Span]) -> None:
        """A worker's trace that may record a model call another trace records too: joined and evaluated here."""
        ...

    def take_promoted(self, rows: list[Any]) -> None:
        """Rows a worker's policies promoted (`promote_to: store`): written to the store from here."""
        ...

    def meet_sessions(self, timeout: float, max_sessions: int, max_spans: int) -> None:
        """Assemble sessions here from every worker's traces, bounded by the pipeline's `SessionSettings`."""
        ...


@runtime_checkable
class JudgeUser(Protocol):
    """A collector-process instance that calls judges (evaluate's hub, for sessions and duplicate calls).

    `Service._build_receivers_for_workers` points its judges at the worker pool's ledger (or the pool at its shared
    ledger), so the workers and the collector process spend one judge budget and one rate limit."""

    judges: Any
    """Its judges' runtime (`evalsi.evaluators.judge_client.Judges`), whose `ledger` the service sets."""

    shared_ledger: Any
    """The ledger it shares with other replicas through the store (`replicas:`), which the workers' judges then use
    too; None: the service points its judges at the pool's ledger."""


@runtime_checkable
class WorkerWatcher(Protocol):
    """A collector-process instance that must see the worker processes: memory_limiter (`meets=True`).

    `Service._build_receivers_for_workers` hands it the `WorkerPool`, so the workers' memory counts with the
    collector's and it can have them collect garbage."""

    def watch(self, workers: Any) -> None:
        """Count these workers' memory too (`memory_limiter.Workers`: their pids, and `collect_garbage`)."""
        ...


@runtime_checkable
class Admitter(Protocol):
    """A processor that heads a pipeline and may refuse a request before any of it is taken: memory_limiter.

    With pipeline workers the pipelines run past the hand-off to the workers, where a refusal could no longer reach
    the sender; so `Service` has each request pass the `admit` of its pipelines' heads in the collector process
    first."""

    def admit(self, signal: str, items: int) -> None:
        """Raise `Refused` when `items` more items of `signal` should not be taken now."""
        ...


@runtime_checkable
class BodyAdmitter(Protocol):
    """A processor that may refuse a request's body before it is read: memory_limiter.

    The service hands every processor that offers it to the API (`collector/body_limit.py`), which asks before it
    reads each request body, so a large body is refused before it is in memory."""

    def admit_body(self, size: int) -> None:
        """Raise `Refused` when `size` more bytes of a body should not be read now; else count them."""
        ...

    def release_body(self, size: int) -> None:
        """The admitted bytes of a request whose answer is sent."""
        ...


# --- with pipeline workers: a worker's instances, told by the collector process -------------------------------------


@runtime_checkable
class FeedbackTaker(Protocol):
    """A worker's instance that holds recent traces for late feedback: evaluate.

    The collector routes feedback scores (`CollectorPeers.route_feedback`) to the worker that owns their trace,
    whose loop (`collector/workers/worker.py`) hands them to the processor the message names."""

    def take_feedback(self, scores: list[Score]) -> None:
        """Feedback for traces it holds or evaluated: the late path of its policies."""
        ...


@runtime_checkable
class DuplicateCallJoiner(Protocol):
    """A worker's instance that hands the collector traces which may record a model call twice: evaluate.

    When the collector sees a service send lone vendor SDK calls (`CollectorPeers.arm_twins`), each worker's loop
    tells the processor the message names, so every worker hands that service's root-level calls over."""

    def arm_twins(self, service: str) -> None:
        """`service` sends lone vendor SDK calls: hand its root-level model calls to the collector too."""
        ...


@runtime_checkable
class GarbageCollector(Protocol):
    """A worker's instance that can free memory on request: memory_limiter.

    The collector's memory_limiter, above its limit, has the pool tell every worker (`Workers.collect_garbage`),
    whose loop calls it on the processor the message names."""

    def collect_garbage(self) -> None:
        """Run a garbage collection now."""
        ...
