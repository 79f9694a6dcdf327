"""The LLM judge that judge-based evaluators share: versioned prompt templates, one OpenAI-compatible call with
retries, verdict parsing with a fallback, the content-hash cache, rate limits, call/token/USD budgets and metrics.

The state (the cache, budget spend, HTTP clients, metrics) belongs to a `Judges`, the judge runtime of one service,
which evaluators find on `Target.judges`. An evaluator builds its messages from a `PromptTemplate` and calls
`target.judges.judge(params, template, messages)`; it gets one Score back: scored, `skipped` (no judge configured,
budget exhausted) or `error` (judge unavailable, unparseable verdict), never a zero for an outage.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import threading
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator

from evalsi.duration import Duration
from evalsi.evaluators.params import Params
from evalsi.model.score import Score
from evalsi.runtime.backoff import Backoff, retry_after
from evalsi.runtime.telemetry import SelfMetrics

if TYPE_CHECKING:
    import httpx

# --- prompt templates ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PromptTemplate:
    """A judge prompt: a system message and a user message template, under a version to bump when either changes.

    `hash` covers the version, both texts and `extra` (e.g. named rubrics): every score's metadata carries it, so a
    stored score says which prompt judged it, and a changed prompt never answers from the cache.
    """

    version: str
    system: str
    user: str
    extra: tuple[str, ...] = ()
    hash: str = field(init=False)

    def __post_init__(self) -> None:
        material = "\x00".join((self.version, self.system, self.user, *self.extra))
        object.__setattr__(self, "hash", hashlib.sha256(material.encode()).hexdigest()[:16])

    def messages(self, **fields: str) -> list[dict[str, str]]:
        """The chat messages for the judge: the system message, and the user template filled with `fields`."""
        return [{"role": "system", "content": self.system}, {"role": "user", "content": self.user.format(**fields)}]


VERDICT_FORMAT = (
    'Reply with one JSON object and nothing else: {"score": <number from 0 to 1>, "passed": <true|false>, '
    '"label": "<one word>", "explanation": "<one or two sentences>"}.'
)
"""The reply every template asks for; `parse_verdict` reads it."""

# --- the verdict ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Verdict:
    value: float
    passed: bool
    label: str | None
    explanation: str | None


class UnparseableVerdict(ValueError):
    pass


_NUMBER = re.compile(r"(?<![\w.])(\d+(?:\.\d+)?)(?![\w.])")
_DECODER = json.JSONDecoder()


def _first_object(text: str) -> dict[str, Any] | None:
    """The first JSON object in `text` (bare, fenced in ``` or embedded in prose)."""
    start = text.find("{")
    while start != -1:
        try:
            obj, _ = _DECODER.raw_decode(text, start)
        except ValueError:
            pass
        else:
            if isinstance(obj, dict):
                return obj
        start = text.find("{", start + 1)
    return None


def _unit(raw: Any) -> float:
    if isinstance(raw, bool) or not isinstance(raw, int | float | str):
        raise UnparseableVerdict(f"score is not a number: {raw!r}")
    try:
        value = float(raw)
    except ValueError:
        raise UnparseableVerdict(f"score is not a number: {raw!r}") from None
    if not 0.0 <= value <= 1.0:
        raise UnparseableVerdict(f"score {value} is outside 0..1")
    return value


def parse_verdict(text: str, threshold: float) -> Verdict:
    """The judge's reply as a verdict: a JSON object (bare or fenced) with `score`, `passed`, `label`,
    `explanation`; else the first number in the text (0..1); else UnparseableVerdict."""
    obj = _first_object(text)
    if obj is not None:
        if "score" not in obj:
            if isinstance(obj.get("passed"), bool):  # a pass/fail-only verdict
                obj = {**obj, "score": 1.0 if obj["passed"] else 0.0}
            else:
                raise UnparseableVerdict("the verdict has no score")
        value = _unit(obj["score"])
        passed = obj.get("passed")
        label, explanation = obj.get("label"), obj.get("explanation")
        return Verdict(
            value,
            passed if isinstance(passed, bool) else value >= threshold,
            str(label) if label is not None else None,
            str(explanation) if explanation is not None else None,
        )
    match = _NUMBER.search(text)
    if match is None:
        raise UnparseableVerdict("no JSON object and no number in the reply")
    value = _unit(match.group(1))
    return Verdict(value, value >= threshold, None, text.strip()[:500] or None)


# --- params --------------------------------------------------------------------------------------------------


class Budget(BaseModel):
    """Limits per policy stage and window; unset limits are unlimited. Cache hits cost nothing."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    max_calls: int | None = Field(None, ge=0)
    max_tokens: int | None = Field(None, ge=0)
    max_usd: float | None = Field(None, ge=0)
    window_s: Duration = Field(300.0, gt=0)
    """The budget's tumbling window: a duration (`1h`) or seconds."""


class Price(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    input_per_1k: float = Field(0.0, ge=0)
    output_per_1k: float = Field(0.0, ge=0)


class JudgeConfig(Params):
    """The params every judge-based evaluator takes: where the judge is, how to call it, what it may spend.

    Subclasses add their own params and set `name`'s default to their score's name.
    """

    name: str = Field("llm-judge", min_length=1)
    """The score's name (run two judges of one kind in one policy under two names)."""
    endpoint: str | None = None
    """OpenAI-compatible base URL (…/v1); else env EVALSI_JUDGE_BASE_URL; else the judge is skipped."""
    model: str | None = None
    """Else env EVALSI_JUDGE_MODEL; else the judge is skipped."""
    api_key: str | None = Field(None, repr=False)
    """`env:VAR` reads the variable when the judge is called; else env EVALSI_JUDGE_API_KEY; else no key."""
    temperature: float = Field(0.0, ge=0, le=2)
    max_tokens: int = Field(512, gt=0)
    timeout_s: Duration = Field(30.0, gt=0)
    """Per HTTP attempt: a duration (`30s`) or seconds."""
    retries: int = Field(3, ge=0, le=10)
    """Retries after a 5xx, 429 or timeout, before `error: judge unavailable`."""
    backoff_s: Duration = Field(0.5, ge=0)
    """First retry delay; doubles each retry (capped at 30s, each wait within ±20%:
    `evalsi.runtime.backoff.Backoff`); a Retry-After header (seconds or an HTTP date, at most 30s) wins."""
    threshold: float = Field(0.5, ge=0, le=1)
    """`passed` when the verdict gives none: score >= threshold."""
    budget: Budget = Budget()
    price: Price = Price()
    rate_limit_per_s: float | None = Field(None, gt=0)
    """At most this many judge calls per second from this policy stage (the worker thread waits)."""

    # budget and rate-limit state (kept by `Judges`) are keyed by this params object: one per policy cascade stage
    _id: str = PrivateAttr(default_factory=lambda: uuid.uuid4().hex)

    @field_validator("endpoint")
    @classmethod
    def _endpoint(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("http://", "https://")):
            raise ValueError(f"endpoint must be an http(s) URL, got {value!r}")
        return value.rstrip("/") if value else value

    @field_validator("api_key")
    @classmethod
    def _api_key(cls, value: str | None) -> str | None:
        if value is not None and value.startswith("env:") and not value[4:]:
            raise ValueError("api_key 'env:' names no variable; write env:VAR")
        return value


# --- the runtime's parts: the verdict cache and budget spend -------------------------------------------------

CACHE_SIZE = 10_000


class VerdictCache:
    """A bounded LRU of content hash -> verdict, shared by every judge of one `Judges`."""

    def __init__(self, size: int = CACHE_SIZE) -> None:
        self.size = size
        self._items: OrderedDict[str, Verdict] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: str) -> Verdict | None:
        with self._lock:
            found = self._items.get(key)
            if found is not None:
                self._items.move_to_end(key)
            return found

    def put(self, key: str, verdict: Verdict) -> None:
        with self._lock:
            self._items[key] = verdict
            self._items.move_to_end(key)
            while len(self._items) > self.size:
                self._items.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._items.clear()

    def __len__(self) -> int:
        return len(self._items)


@dataclass
class BudgetSpend:
    calls: int = 0
    tokens: int = 0
    usd: float = 0.0


class LedgerUnavailable(Exception):
    """A budget shared through the store cannot be checked (the store is down): the judgment is skipped rather than
    made past a budget no one can see."""


class JudgeLedger(Protocol):
    """What judges spend, per budget slot `(params id, window index)`, and when each judge's next call may start.
    A params id is `<policy>#<stage>` for loaded policies, so every process names a stage's budget alike."""

    def reserve(self, slot: tuple[str, int], max_calls: int | None, max_tokens: int | None,
                max_usd: float | None) -> bool: ...  # fmt: skip

    def charge(self, slot: tuple[str, int], tokens: int, usd: float) -> None: ...

    def next_call(self, judge: str, interval_s: float) -> float:
        """Take the judge's next call slot: the monotonic time the call may start (now or later)."""
        ...


class LocalLedger:
    """A ledger in this process, thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.budgets: dict[tuple[str, int], BudgetSpend] = {}
        """(params id, window index) -> spend. A params object is one policy's cascade stage: its budget is that
        stage's, shared by every trace the policy evaluates in the window."""
        self._next_call: dict[str, float] = {}  # params id -> monotonic time its next call may start

    def reserve(self, slot: tuple[str, int], max_calls: int | None, max_tokens: int | None,
                max_usd: float | None) -> bool:  # fmt: skip
        with self._lock:
            for old in [k for k in self.budgets if k[0] == slot[0] and k[1] < slot[1]]:
                del self.budgets[old]
            spend = self.budgets.setdefault(slot, BudgetSpend())
            if (
                (max_calls is not None and spend.calls >= max_calls)
                or (max_tokens is not None and spend.tokens >= max_tokens)
                or (max_usd is not None and spend.usd >= max_usd)
            ):
                return False
            spend.calls += 1
            return True

    def charge(self, slot: tuple[str, int], tokens: int, usd: float) -> None:
        with self._lock:
            spend = self.budgets.setdefault(slot, BudgetSpend())
            spend.tokens += tokens
            spend.usd += usd

    def next_call(self, judge: str, interval_s: float) -> float:
        with self._lock:
            now = time.monotonic()
            at = max(now, self._next_call.get(judge, 0.0))
            self._next_call[judge] = at + interval_s
            return at


# --- the call ------------------------------------------------------------------------------------------------


class JudgeUnavailable(Exception):
    pass


def _api_key(params: JudgeConfig) -> str | None:
    raw = params.api_key
    if raw is None:
        return os.environ.get("EVALSI_JUDGE_API_KEY") or None
    if raw.startswith("env:"):
        return os.environ.get(raw[4:]) or None
    return raw


def _cache_key(
    params: JudgeConfig, template: PromptTemplate, endpoint: str, model: str, messages: list[dict[str, str]]
) -> str:
    material = json.dumps(
        [endpoint, model, params.temperature, params.max_tokens, params.threshold, template.hash, messages],
        separators=(",", ":"),
        ensure_ascii=False,
    )
    return hashlib.sha256(material.encode()).hexdigest()


def _judged(score: Score, template: PromptTemplate, cost: float | None = None, **meta: Any) -> Score:
    score.source = "llm_judge"
    score.judge_cost_usd = cost
    score.metadata.update(template_version=template.version, template_hash=template.hash, **meta)
    return score


MAX_RETRY_WAIT_S = 30.0
"""No retry waits longer than this, whether the backoff or the judge's Retry-After asks for more."""


# --- the runtime ---------------------------------------------------------------------------------------------


class Judges:
    """The judge runtime of one service: verdict cache, budget spend, HTTP clients and the judge metrics.

    The service (and its `evaluate` processor) builds one and hands it to evaluators on `Target.judges`. Its
    metrics come from `metrics.counter()`, so several `Judges` of one service count into the same series; the
    cache and budget spend are its own, so two `Judges` (two services, two tests) never share a verdict or a budget.
    """

    def __init__(
        self, metrics: SelfMetrics, *, cache_size: int = CACHE_SIZE, ledger: JudgeLedger | None = None
    ) -> None:
        self.cache = VerdictCache(cache_size)
        self.ledger: JudgeLedger = ledger if ledger is not None else LocalLedger()
        """Budget spend and rate-limit slots: this process's own, or the collector's for pipeline workers (one
        budget, one rate limit, however many processes judge)."""
        self._clients: dict[float, httpx.Client] = {}
        self._clients_lock = threading.Lock()
        self.budget_exhausted = metrics.counter(
            "evalsi_judge_budget_exhausted", "Judgments skipped because a judge budget was spent.", ["judge", "model"]
        )
        self.calls = metrics.counter(
            "evalsi_judge_calls",
            "HTTP calls to a judge, by result (ok, retry, unavailable, error).",
            ["judge", "model", "result"],
        )
        self.cache_hits = metrics.counter(
            "evalsi_judge_cache_hits", "Judgments answered from the content-hash cache.", ["judge", "model"]
        )
        self.cost = metrics.counter("evalsi_judge_cost_usd", "USD spent on judges.", ["judge", "model"])
        self.tokens = metrics.counter("evalsi_judge_tokens", "Tokens used by judges.", ["judge", "model"])

    def close(self) -> None:
        """Close the HTTP clients (a later call opens new ones)."""
        with self._clients_lock:
            clients, self._clients = list(self._clients.values()), {}
        for client in clients:
            client.close()

    # --- budgets and the rate limit -------------------------------------------------------------------------

    def _reserve(self, params: JudgeConfig, slot: tuple[str, int]) -> bool:
        """Take one call from the budget, or False when any limit is spent."""
        b = params.budget
        return self.ledger.reserve(slot, b.max_calls, b.max_tokens, b.max_usd)

    def _charge(self, slot: tuple[str, int], tokens: int, usd: float) -> None:
        self.ledger.charge(slot, tokens, usd)

    def _wait_for_rate(self, params: JudgeConfig) -> None:
        if params.rate_limit_per_s is None:
            return
        now = time.monotonic()
        at = self.ledger.next_call(params._id, 1.0 / params.rate_limit_per_s)
        if at > now:
            time.sleep(at - now)

    # --- the call -------------------------------------------------------------------------------------------

    def _client(self, timeout_s: float) -> httpx.Client:
        with self._clients_lock:
            client = self._clients.get(timeout_s)
            if client is None:
                import httpx  # here: a service without judges (every pipeline worker of most) never loads it

                client = self._clients[timeout_s] = httpx.Client(timeout=timeout_s)
            return client

    def _call(self, params: JudgeConfig, endpoint: str, model: str, messages: list[dict[str, str]]) -> dict[str, Any]:
        """POST chat/completions; retries 5xx, 429 and timeouts (waiting as `Backoff` says, or as the judge's
        Retry-After says: seconds or an HTTP date, at most 30 s); raises JudgeUnavailable when they persist."""
        body = {
            "model": model, "messages": messages, "temperature": params.temperature, "max_tokens": params.max_tokens,
        }  # fmt: skip
        headers = {"content-type": "application/json"}
        key = _api_key(params)
        if key:
            headers["authorization"] = f"Bearer {key}"
        url = f"{endpoint}/chat/completions"
        client = self._client(params.timeout_s)
        import httpx  # loaded by `_client`

        backoff = Backoff(initial=params.backoff_s, maximum=MAX_RETRY_WAIT_S, max_retry_after=MAX_RETRY_WAIT_S)
        last = "no attempt"
        for attempt in range(params.retries + 1):
            response: httpx.Response | None = None
            try:
                response = client.post(url, json=body, headers=headers)
            except (httpx.TimeoutException, httpx.TransportError) as e:
                last = f"{type(e).__name__}: {e}"
            else:
                if response.status_code < 400:
                    self.calls.labels(params.name, model, "ok").inc()
                    return response.json()
                if response.status_code != 429 and response.status_code < 500:
                    self.calls.labels(params.name, model, "error").inc()
                    raise JudgeUnavailable(f"HTTP {response.status_code}: {response.text[:200]}")
                last = f"HTTP {response.status_code}"
            if attempt < params.retries:
                self.calls.labels(params.name, model, "retry").inc()
                server_says = retry_after(response.headers.get("retry-after")) if response is not None else None
                time.sleep(backoff.next_wait(server_says))
        self.calls.labels(params.name, model, "unavailable").inc()
        raise JudgeUnavailable(f"{last} after {params.retries + 1} attempts")

    def judge(self, params: JudgeConfig, template: PromptTemplate, messages: list[dict[str, str]]) -> Score:
        """Ask the configured judge for a verdict on `messages` (built from `template`): from the cache when the
        same judgment was made before, else one call within the stage's budget and rate limit. The score is named
        `params.name`; its metadata names the template, its hash and the model."""
        endpoint = params.endpoint or os.environ.get("EVALSI_JUDGE_BASE_URL", "").rstrip("/")
        model = params.model or os.environ.get("EVALSI_JUDGE_MODEL")
        if not endpoint or not model:
            return _judged(Score.skipped(params.name, "no judge configured"), template)
        key = _cache_key(params, template, endpoint, model, messages)
        cached = self.cache.get(key)
        if cached is not None:
            self.cache_hits.labels(params.name, model).inc()
            return _verdict_score(params, template, cached, model, 0.0, cached=True)
        slot = (params._id, int(time.time() // params.budget.window_s))
        try:
            reserved = self._reserve(params, slot)
        except LedgerUnavailable as e:
            skipped = Score.skipped(params.name, "budget ledger unavailable")
            skipped.explanation = str(e)
            return _judged(skipped, template)
        if not reserved:
            self.budget_exhausted.labels(params.name, model).inc()
            return _judged(Score.skipped(params.name, "budget exhausted"), template)
        self._wait_for_rate(params)
        try:
            reply = self._call(params, endpoint, model, messages)
        except JudgeUnavailable as e:
            return _judged(Score.error(params.name, "judge unavailable", str(e)), template)
        usage = reply.get("usage") if isinstance(reply, dict) else None
        usage = usage if isinstance(usage, dict) else {}
        prompt_tokens = int(usage.get("prompt_tokens") or 0)
        completion_tokens = int(usage.get("completion_tokens") or 0)
        price = params.price
        cost = prompt_tokens / 1000 * price.input_per_1k + completion_tokens / 1000 * price.output_per_1k
        self._charge(slot, prompt_tokens + completion_tokens, cost)
        self.tokens.labels(params.name, model).inc(prompt_tokens + completion_tokens)
        self.cost.labels(params.name, model).inc(cost)
        try:
            text = reply["choices"][0]["message"]["content"]
            if not isinstance(text, str):
                raise TypeError
        except (KeyError, IndexError, TypeError):
            missing = "the reply has no choices[0].message.content"
            return _judged(Score.error(params.name, "unparseable verdict", missing), template, cost)
        try:
            verdict = parse_verdict(text, params.threshold)
        except UnparseableVerdict as e:
            return _judged(Score.error(params.name, "unparseable verdict", f"{e}: {text[:200]!r}"), template, cost)
        self.cache.put(key, verdict)
        tokens = {"input_tokens": prompt_tokens, "output_tokens": completion_tokens}
        return _verdict_score(params, template, verdict, model, cost, cached=False, **tokens)


def _verdict_score(
    params: JudgeConfig, template: PromptTemplate, verdict: Verdict, model: str, cost: float | None, **meta: Any
) -> Score:
    score = Score(
        params.name,
        value=verdict.value,
        passed=verdict.passed,
        label=verdict.label,
        explanation=verdict.explanation,
    )
    return _judged(score, template, cost, model=model, **meta)
