"""`builtin/llm-judge` against a local OpenAI-compatible server written for the test (no network): the request's
shape, verdict parsing, the content-hash cache, retries, outages as errors, budgets and their metric. Each test has
its own judge runtime (`Judges`) over its own metrics, put on the Targets it builds."""

from __future__ import annotations

import email.utils
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fake_judge import FakeJudge
from running_collector import FIXTURES

from evalsi.evaluators import REGISTRY, Target, judge_client, load_evaluators, parse_params, run
from evalsi.evaluators.judge_client import Judges
from evalsi.evaluators.packs import judge
from evalsi.model.score import Score
from evalsi.model.span import Span
from evalsi.model.trajectory import build_trajectory
from evalsi.processors.normalize.files import normalize_files
from evalsi.runtime.telemetry import SelfMetrics

load_evaluators()
JUDGE = REGISTRY["builtin/llm-judge"]


@pytest.fixture
def server() -> Iterator[FakeJudge]:
    fake = FakeJudge()
    fake.thread.start()
    yield fake
    fake.server.shutdown()
    fake.server.server_close()


@pytest.fixture
def metrics() -> SelfMetrics:
    return SelfMetrics()


@pytest.fixture
def judges(metrics: SelfMetrics) -> Iterator[Judges]:
    """This test's judge runtime: its own cache and budgets, its metrics in `metrics`."""
    runtime = Judges(metrics)
    yield runtime
    runtime.close()


@pytest.fixture(autouse=True)
def _no_judge_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("EVALSI_JUDGE_BASE_URL", "EVALSI_JUDGE_MODEL", "EVALSI_JUDGE_API_KEY"):
        monkeypatch.delenv(var, raising=False)


def _files(folder: str, scenario: str, logs: bool = True) -> list[Path]:
    files = [FIXTURES / folder / f"{scenario}.pb"]
    log_file = FIXTURES / folder / f"{scenario}.logs.pb"
    return files + ([log_file] if logs and log_file.exists() else [])


def _target(spans: list[Span], judges: Judges | None, **reference: Any) -> Target:
    ids = {s.span_id for s in spans}
    root = min((s for s in spans if s.parent_span_id not in ids), key=lambda s: s.start_time_unix_nano)
    return Target(spans, span=root, trajectory=build_trajectory(spans), reference=reference, judges=judges)


def _fixture(
    judges: Judges | None, folder: str = "otel-openai-v2", scenario: str = "chat_simple", logs: bool = True
) -> Target:
    return _target(normalize_files(_files(folder, scenario, logs)).spans, judges)


def _meta(folder: str, scenario: str) -> dict[str, Any]:
    return json.loads((FIXTURES / folder / "meta.json").read_text())["scenarios"][scenario]


def _params(server: FakeJudge, **params: Any) -> Any:
    return parse_params(JUDGE, {"endpoint": server.url, "model": "judge-1", "backoff_s": 0.001, **params})


def _judge(target: Target, params: Any) -> Score:
    (score,) = run(JUDGE, target, params)
    assert score.evaluator == "builtin/llm-judge"
    assert score.source == "llm_judge"
    assert score.metadata["template_hash"] == judge.TEMPLATE_HASH
    return score


# --- the request and a verdict -------------------------------------------------------------------------------


@pytest.mark.parametrize("folder", ["otel-openai-v2", "openinference", "openlit"])
def test_judges_a_captured_trace(server: FakeJudge, folder: str, judges: Judges) -> None:
    markers = _meta(folder, "chat_simple")["markers"]
    score = _judge(_fixture(judges, folder), _params(server, api_key="env:MY_JUDGE_KEY"))

    assert (score.outcome, score.value, score.passed, score.label) == ("scored", 0.9, True, "correct")
    assert score.explanation == "Paris."
    (request,) = server.requests
    assert request["path"] == "/v1/chat/completions"
    assert request["model"] == "judge-1" and request["temperature"] == 0 and request["max_tokens"] == 512
    system, user = request["messages"]
    assert system["role"] == "system" and "JSON" in system["content"]
    assert user["role"] == "user"
    assert markers["prompt"] in user["content"] and markers["completion"] in user["content"]
    assert judge.RUBRICS["correctness"] in user["content"]
    assert "authorization" not in server.headers[0]  # env:MY_JUDGE_KEY is unset


def test_cost_and_tokens_from_usage(server: FakeJudge, monkeypatch: pytest.MonkeyPatch, judges: Judges) -> None:
    monkeypatch.setenv("MY_JUDGE_KEY", "sk-test")
    params = _params(server, api_key="env:MY_JUDGE_KEY", price={"input_per_1k": 0.01, "output_per_1k": 0.03})
    score = _judge(_fixture(judges), params)
    # 1000 prompt tokens at $0.01/1k + 500 completion tokens at $0.03/1k
    assert score.judge_cost_usd == pytest.approx(0.01 + 0.015)
    assert (score.metadata["input_tokens"], score.metadata["output_tokens"]) == (1000, 500)
    assert score.metadata["template_version"] == judge.TEMPLATE_VERSION
    assert server.headers[0]["authorization"] == "Bearer sk-test"


def test_env_configures_the_judge(server: FakeJudge, monkeypatch: pytest.MonkeyPatch, judges: Judges) -> None:
    monkeypatch.setenv("EVALSI_JUDGE_BASE_URL", server.url)
    monkeypatch.setenv("EVALSI_JUDGE_MODEL", "judge-env")
    monkeypatch.setenv("EVALSI_JUDGE_API_KEY", "sk-env")
    score = _judge(_fixture(judges), parse_params(JUDGE, {"rubric": "helpfulness"}))
    assert score.outcome == "scored"
    assert server.requests[0]["model"] == "judge-env"
    assert judge.RUBRICS["helpfulness"] in server.requests[0]["messages"][1]["content"]
    assert server.headers[0]["authorization"] == "Bearer sk-env"


def test_custom_rubric_and_reference(server: FakeJudge, judges: Judges) -> None:
    target = _fixture(judges)
    target.reference["expected_output"] = "Paris"
    target.context = ["France's capital city is Paris."]
    _judge(target, _params(server, rubric="Answer in one sentence, naming the city."))
    content = server.requests[0]["messages"][1]["content"]
    assert "Answer in one sentence, naming the city." in content
    assert "# Expected answer\nParis" in content and "France's capital city is Paris." in content


# --- verdict parsing -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("reply", "value", "passed", "label"),
    [
        (
            '{"score": 0.25, "passed": false, "label": "wrong", "explanation": "Lyon is not the capital."}',
            0.25,
            False,
            "wrong",
        ),
        ('```json\n{"score": 1, "passed": true, "label": "correct", "explanation": "ok"}\n```', 1.0, True, "correct"),
        ('Here is my verdict: {"score": 0.7, "explanation": "mostly right"} Thanks.', 0.7, True, None),
        ('{"passed": false, "explanation": "no"}', 0.0, False, None),
        ("Score: 0.4", 0.4, False, None),
        ("0.8", 0.8, True, None),
    ],
)
def test_verdict_parsing(
    server: FakeJudge, reply: str, value: float, passed: bool, label: str | None, judges: Judges
) -> None:
    server.verdict = reply
    score = _judge(_fixture(judges), _params(server))
    assert (score.outcome, score.value, score.passed, score.label) == ("scored", value, passed, label)


@pytest.mark.parametrize("reply", ["I cannot judge this.", '{"verdict": "good"}', '{"score": 7}', "Score: 8/10"])
def test_unparseable_verdict_is_an_error_not_a_zero(server: FakeJudge, reply: str, judges: Judges) -> None:
    server.verdict = reply
    score = _judge(_fixture(judges), _params(server))
    assert (score.outcome, score.reason, score.value, score.passed) == ("error", "unparseable verdict", None, None)
    # an unparseable verdict is not cached: the next attempt asks again
    _judge(_fixture(judges), _params(server))
    assert len(server.requests) == 2


def test_threshold_decides_passed_when_the_verdict_has_none(server: FakeJudge, judges: Judges) -> None:
    server.verdict = '{"score": 0.6}'
    assert _judge(_fixture(judges), _params(server, threshold=0.75)).passed is False


# --- cache ---------------------------------------------------------------------------------------------------


def test_identical_judgments_hit_the_cache(server: FakeJudge, judges: Judges) -> None:
    params = _params(server, price={"input_per_1k": 0.01})
    first = _judge(_fixture(judges), params)
    second = _judge(_fixture(judges), _params(server, price={"input_per_1k": 0.01}))  # another stage, same judge
    assert len(server.requests) == 1
    assert (second.value, second.passed, second.label) == (first.value, first.passed, first.label)
    assert first.metadata["cached"] is False and second.metadata["cached"] is True
    assert second.judge_cost_usd == 0.0
    # a different rubric, model or answer is a different judgment
    _judge(_fixture(judges), _params(server, rubric="helpfulness"))
    _judge(_fixture(judges), _params(server, model="judge-2"))
    _judge(_fixture(judges, "openinference", "chat_tools"), params)
    assert len(server.requests) == 4


def test_the_same_exchange_from_three_instrumentations_is_judged_once(server: FakeJudge, judges: Judges) -> None:
    params = _params(server)
    scores = [_judge(_fixture(judges, folder), params) for folder in ("otel-openai-v2", "openinference", "openlit")]
    assert len(server.requests) == 1
    assert [s.metadata["cached"] for s in scores] == [False, True, True]


def test_two_judge_runtimes_share_neither_cache_nor_budget(server: FakeJudge, metrics: SelfMetrics) -> None:
    one, two = Judges(metrics), Judges(metrics)
    params = _params(server, budget={"max_calls": 1})
    first, other = _fixture(None), _fixture(None, "openinference", "chat_tools")
    first.judges = other.judges = one
    assert _judge(first, params).metadata["cached"] is False
    assert _judge(first, params).metadata["cached"] is True  # one's cache
    assert _judge(other, params).reason == "budget exhausted"  # one's budget is spent
    first.judges = other.judges = two
    # two has not seen the judgment, and its budget for this same stage is untouched
    assert _judge(first, params).metadata["cached"] is False
    assert _judge(other, params).reason == "budget exhausted"
    assert len(server.requests) == 2
    # the metrics are the service's: both runtimes count into the same series
    assert one.calls is two.calls
    labels = {"judge": "llm-judge", "model": "judge-1"}
    assert metrics.registry.get_sample_value("evalsi_judge_calls_total", {**labels, "result": "ok"}) == 2
    assert metrics.registry.get_sample_value("evalsi_judge_cache_hits_total", labels) == 1
    assert metrics.registry.get_sample_value("evalsi_judge_budget_exhausted_total", labels) == 2
    one.close()
    two.close()


def test_cache_is_bounded() -> None:
    cache = judge_client.VerdictCache(size=2)
    v = judge_client.Verdict(1.0, True, None, None)
    for key in "abc":
        cache.put(key, v)
    assert len(cache) == 2 and cache.get("a") is None and cache.get("c") is v


# --- outages -------------------------------------------------------------------------------------------------


def test_5xx_then_success_is_retried(server: FakeJudge, judges: Judges) -> None:
    server.script = [(503, {"error": "overloaded"}, {}), (429, {"error": "slow down"}, {"retry-after": "0"})]
    score = _judge(_fixture(judges), _params(server))
    assert (score.outcome, score.value) == ("scored", 0.9)
    assert len(server.requests) == 3


def test_persistent_5xx_is_an_error_never_a_zero(server: FakeJudge, judges: Judges) -> None:
    server.script = [(500, {"error": "boom"}, {})] * 10
    score = _judge(_fixture(judges), _params(server, retries=2))
    assert (score.outcome, score.reason) == ("error", "judge unavailable")
    assert score.value is None and score.passed is None
    assert "HTTP 500 after 3 attempts" in (score.explanation or "")
    assert len(server.requests) == 3


def test_unreachable_judge_is_an_error(judges: Judges) -> None:
    params = parse_params(
        JUDGE, {"endpoint": "http://127.0.0.1:9/v1", "model": "m", "retries": 1, "backoff_s": 0, "timeout_s": 1}
    )
    score = run(JUDGE, _fixture(judges), params)[0]
    assert (score.outcome, score.reason, score.value) == ("error", "judge unavailable", None)


def test_client_error_is_not_retried(server: FakeJudge, judges: Judges) -> None:
    server.script = [(401, {"error": "bad key"}, {})]
    score = _judge(_fixture(judges), _params(server))
    assert (score.outcome, score.reason) == ("error", "judge unavailable")
    assert len(server.requests) == 1


def test_retry_after_as_an_http_date_is_honoured(server: FakeJudge, judges: Judges, metrics: SelfMetrics) -> None:
    # an HTTP date has whole seconds: two seconds ahead, truncated, is 1-2 s from now
    when = email.utils.formatdate(time.time() + 2, usegmt=True)
    server.script = [(429, {"error": "slow down"}, {"retry-after": when})]
    start = time.monotonic()
    score = _judge(_fixture(judges), _params(server))  # backoff_s=0.001: only the header makes it wait
    waited = time.monotonic() - start
    assert (score.outcome, score.value) == ("scored", 0.9)
    assert len(server.requests) == 2
    assert 0.9 <= waited < 2.9
    calls = {"judge": "llm-judge", "model": "judge-1"}
    assert metrics.registry.get_sample_value("evalsi_judge_calls_total", {**calls, "result": "retry"}) == 1
    assert metrics.registry.get_sample_value("evalsi_judge_calls_total", {**calls, "result": "ok"}) == 1


@pytest.mark.parametrize("header", ["3600", "Fri, 01 Jan 2100 00:00:00 GMT"])
def test_retry_waits_are_capped_at_30s(
    server: FakeJudge, judges: Judges, monkeypatch: pytest.MonkeyPatch, header: str
) -> None:
    waits: list[float] = []
    monkeypatch.setattr(judge_client.time, "sleep", waits.append)
    server.script = [(503, {}, {"retry-after": header}), (503, {}, {}), (503, {}, {})]
    score = _judge(_fixture(judges), _params(server, backoff_s=20, retries=3))
    assert score.outcome == "scored"
    # the server's wait, capped; then the backoff's own: 40 s, capped to 30 s (within the shared ±20% jitter)
    assert waits[0] == 30.0
    assert 30 * 0.8 <= waits[1] <= 30 * 1.2 and 30 * 0.8 <= waits[2] <= 30 * 1.2


# --- budgets -------------------------------------------------------------------------------------------------


def _exhausted(metrics: SelfMetrics, model: str) -> float:
    value = metrics.registry.get_sample_value(
        "evalsi_judge_budget_exhausted_total", {"judge": "llm-judge", "model": model}
    )
    return value or 0.0


def test_budget_of_three_calls_skips_the_fourth(server: FakeJudge, judges: Judges, metrics: SelfMetrics) -> None:
    params = _params(server, model="budget-model", budget={"max_calls": 3})
    assert _exhausted(metrics, "budget-model") == 0
    targets = [
        _fixture(judges, "otel-openai-v2", sc) for sc in ("chat_simple", "chat_tools", "chat_pii", "chat_stream")
    ]
    outcomes = [_judge(t, params) for t in targets]
    assert [s.outcome for s in outcomes] == ["scored", "scored", "scored", "skipped"]
    assert outcomes[3].reason == "budget exhausted"
    assert len(server.requests) == 3
    assert _exhausted(metrics, "budget-model") == 1
    # a cached judgment costs nothing and still answers
    assert _judge(targets[0], params).outcome == "scored"
    # another policy's stage has its own budget
    assert _judge(targets[3], _params(server, model="budget-model", budget={"max_calls": 3})).outcome == "scored"


def test_usd_budget(server: FakeJudge, judges: Judges) -> None:
    params = _params(server, budget={"max_usd": 0.02}, price={"input_per_1k": 0.01, "output_per_1k": 0.03})
    first = _judge(_fixture(judges, "otel-openai-v2"), params)  # costs $0.025: over the budget after it
    second = _judge(_fixture(judges, "openinference", "chat_tools"), params)
    assert (first.outcome, second.outcome, second.reason) == ("scored", "skipped", "budget exhausted")


def test_budget_window_resets(server: FakeJudge, monkeypatch: pytest.MonkeyPatch, judges: Judges) -> None:
    now = [1_000_000.0]
    monkeypatch.setattr(judge_client.time, "time", lambda: now[0])
    params = _params(server, budget={"max_calls": 1, "window_s": 60})
    assert _judge(_fixture(judges, "otel-openai-v2"), params).outcome == "scored"
    assert _judge(_fixture(judges, "openinference", "chat_tools"), params).reason == "budget exhausted"
    now[0] += 60
    assert _judge(_fixture(judges, "openinference", "chat_tools"), params).outcome == "scored"


def test_rate_limit_spaces_calls(server: FakeJudge, judges: Judges) -> None:
    params = _params(server, rate_limit_per_s=20)
    start = time.monotonic()
    for scenario in ("chat_simple", "chat_tools", "chat_stream"):
        _judge(_fixture(judges, "openinference", scenario), params)
    assert len(server.requests) == 3
    assert time.monotonic() - start >= 2 / 20 * 0.9


# --- when it cannot judge ------------------------------------------------------------------------------------


def test_no_endpoint_is_skipped(judges: Judges) -> None:
    score = run(JUDGE, _fixture(judges), parse_params(JUDGE, {}))[0]
    assert (score.outcome, score.reason, score.value) == ("skipped", "no judge configured", None)
    model_only = run(JUDGE, _fixture(judges), parse_params(JUDGE, {"model": "gpt-4o-mini"}))[0]
    assert model_only.reason == "no judge configured"


def test_no_judge_runtime_is_skipped_without_a_call(server: FakeJudge) -> None:
    score = run(JUDGE, _fixture(None), _params(server))[0]
    assert (score.outcome, score.reason, score.value) == ("skipped", "no judge runtime", None)
    assert server.requests == []


def test_no_content_is_skipped_without_a_call(server: FakeJudge, judges: Judges) -> None:
    # openai-v2 puts content in log records: the spans alone carry none
    score = run(JUDGE, _fixture(judges, logs=False), _params(server))[0]
    assert (score.outcome, score.reason) == ("skipped", "no content")
    assert server.requests == []


def test_failed_call_without_answer_is_skipped(server: FakeJudge, judges: Judges) -> None:
    score = run(JUDGE, _fixture(judges, "otel-openai-v2", "chat_error"), _params(server))[0]
    assert (score.outcome, score.reason) == ("skipped", "no output")
    assert server.requests == []


@pytest.mark.parametrize(
    ("params", "key"),
    [
        ({"endpoint": "localhost:8000"}, "endpoint"),
        ({"budget": {"max_calls": -1}}, "budget.max_calls"),
        ({"budget": {"max_call": 3}}, "budget.max_call"),
        ({"price": {"input": 1}}, "price.input"),
        ({"temperature": 3}, "temperature"),
        ({"api_key": "env:"}, "api_key"),
        ({"rubrik": "correctness"}, "rubrik"),
    ],
)
def test_invalid_params_name_the_key(params: dict[str, Any], key: str) -> None:
    with pytest.raises(ValueError) as e:
        parse_params(JUDGE, params)
    assert str(e.value).startswith(f"{key}:")


def test_api_key_is_not_in_repr() -> None:
    assert "sk-secret" not in repr(parse_params(JUDGE, {"api_key": "sk-secret"}))
