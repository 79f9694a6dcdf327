"""cost_usd from the genai-prices table (normalize's `cost` section): table prices, cache rates, config overrides."""

from __future__ import annotations

import asyncio
import logging
import re
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from captures import normalized_capture
from genai_prices import Usage, calc_price
from genai_prices.data_snapshot import get_snapshot
from genai_prices.types import ModelPrice
from running_collector import serve_config, start_collector, wait_until

from evalsi.collector.config import ConfigError, parse_config
from evalsi.component import Settings
from evalsi.model.span import Span, SpanBatch
from evalsi.processors.normalize import Normalize, NormalizeConfig
from evalsi.processors.normalize.cost import MAX_UNKNOWN_LABELS, CostConfig, Pricer, library_rates, span_cost
from evalsi.runtime.telemetry import SelfMetrics

DOCS = Path(__file__).resolve().parents[2] / "docs" / "conventions.md"
UNKNOWN = "evalsi_normalize_cost_unknown_models_total"


def llm(
    provider: str | None,
    model: str,
    input_tokens: int | None,
    output_tokens: int | None,
    cost: float | None = None,
    **details: Any,
) -> Span:
    s = Span("ab" * 16, "cd" * 8, "", "chat", "CLIENT", 0, 1)
    s.step_type, s.provider, s.model = "llm", provider, model
    s.input_tokens, s.output_tokens, s.cost_usd, s.details = input_tokens, output_tokens, cost, dict(details)
    return s


def priced(span: Span, config: dict[str, Any] | None = None, metrics: SelfMetrics | None = None) -> Span:
    counter = (metrics or SelfMetrics()).counter(UNKNOWN.removesuffix("_total"), "unknown", ["provider", "model"])
    Pricer(CostConfig(**(config or {})), counter).price(span)
    return span


def library_usd(provider: str, model: str, **usage: int) -> float:
    return float(calc_price(Usage(**usage), model, provider_id=provider).total_price)


def test_hand_computed_gpt_4o_mini() -> None:
    # gpt-4o-mini: $0.15 input, $0.60 output per million tokens
    s = priced(llm("openai", "gpt-4o-mini", 1000, 500))
    assert s.cost_usd == pytest.approx(1000 * 0.15e-6 + 500 * 0.60e-6)  # 0.00045


@pytest.mark.parametrize("folder", ["otel-openai-v2", "otel-openai-v2-latest", "openinference", "openllmetry-0.54"])
def test_fixture_models_match_the_library(folder: str) -> None:
    spans = [s for s in normalized_capture(folder, "chat_simple", ".json") if s.input_tokens is not None]
    spans += [s for s in normalized_capture(folder, "embeddings", ".json") if s.input_tokens is not None]
    assert {s.model for s in spans} & {"gpt-4o-mini", "gpt-4o-mini-2024-07-18"}
    for s in spans:
        assert s.cost_usd is None  # these captures carry no cost of their own
        priced(s)
        expected = library_usd(
            "openai",
            s.model or "",
            input_tokens=s.input_tokens or 0,
            output_tokens=s.output_tokens or 0,
            cache_read_tokens=s.details.get("cache_read_input_tokens") or 0,
        )
        assert s.cost_usd == pytest.approx(expected, rel=1e-9), s.model
        assert s.cost_usd > 0


def _sample_models() -> list[tuple[str, str]]:
    """Every 10th text model of the table that has input and output prices and no dated or tiered price."""
    out = []
    for p in get_snapshot().providers:
        for m in p.models:
            prices = m.prices
            if isinstance(prices, ModelPrice) and not m.price_variants:
                keys = {k for k, v in prices.__dict__.items() if v is not None}
                flat = all(isinstance(v, Decimal) for v in prices.__dict__.values() if v is not None)
                if flat and {"input_mtok", "output_mtok"} <= keys <= {
                    "input_mtok",
                    "output_mtok",
                    "cache_read_mtok",
                    "cache_write_mtok",
                }:
                    out.append((p.id, m.id))
    return out[::10]


def test_table_sample_matches_the_library_with_cached_tokens() -> None:
    compared = 0
    for provider, model in _sample_models():
        try:  # the library's usage counts cached tokens inside input_tokens
            theirs = library_usd(
                provider, model, input_tokens=5000, output_tokens=700, cache_read_tokens=3000, cache_write_tokens=1000
            )
        except LookupError:  # an id that is not among its own match names (e.g. regional Bedrock ids)
            continue
        rates = library_rates(provider, model)
        assert rates is not None, (provider, model)
        ours = span_cost(rates, 5000 if rates.cache_in_input else 1000, 700, 3000, 1000)
        assert ours == pytest.approx(theirs, rel=1e-9, abs=1e-15), (provider, model)
        compared += 1
    assert compared > 50


def test_openai_cached_tokens_inside_input_are_priced_at_the_cache_rate() -> None:
    # gpt-4o-mini cache reads: $0.075; OpenAI's prompt_tokens include the cached ones
    s = priced(llm("openai", "gpt-4o-mini", 2000, 100, cache_read_input_tokens=1500))
    assert s.cost_usd == pytest.approx((500 * 0.15 + 1500 * 0.075 + 100 * 0.6) / 1e6)
    assert s.cost_usd == pytest.approx(
        library_usd("openai", "gpt-4o-mini", input_tokens=2000, output_tokens=100, cache_read_tokens=1500)
    )
    assert s.cost_usd < priced(llm("openai", "gpt-4o-mini", 2000, 100)).cost_usd  # type: ignore[operator]


def test_anthropic_cache_reads_and_writes_are_outside_input_tokens() -> None:
    # claude-haiku-4-5: $1 input, $5 output, $0.10 cache read, $1.25 cache write; input_tokens exclude both
    s = priced(
        llm("anthropic", "claude-haiku-4-5", 100, 50, cache_read_input_tokens=4000, cache_creation_input_tokens=800)
    )
    assert s.cost_usd == pytest.approx((100 * 1 + 4000 * 0.1 + 800 * 1.25 + 50 * 5) / 1e6)
    assert s.cost_usd == pytest.approx(
        library_usd(
            "anthropic",
            "claude-haiku-4-5",
            input_tokens=4900,
            output_tokens=50,
            cache_read_tokens=4000,
            cache_write_tokens=800,
        )
    )


def test_cached_tokens_outnumbering_input_are_not_inside_it() -> None:
    s = priced(llm("openai", "gpt-4o-mini", 100, 0, cache_read_input_tokens=1000))
    assert s.cost_usd == pytest.approx((100 * 0.15 + 1000 * 0.075) / 1e6)


def test_a_span_that_carries_a_cost_keeps_it() -> None:
    assert priced(llm("openai", "gpt-4o-mini", 1000, 500, cost=0.5)).cost_usd == 0.5
    # openlit's own gen_ai.usage.cost survives the processor
    spans = [s for s in normalized_capture("openlit", "chat_simple", ".json") if s.cost_usd is not None]
    assert spans
    before = [s.cost_usd for s in spans]
    assert [priced(s).cost_usd for s in spans] == before


def test_spans_without_model_or_tokens_get_no_cost() -> None:
    assert priced(llm("openai", "", 10, 10)).cost_usd is None
    assert priced(llm("openai", "gpt-4o-mini", None, None)).cost_usd is None


def test_unknown_model_has_no_cost_and_is_counted_with_bounded_labels() -> None:
    metrics = SelfMetrics()
    counter = metrics.counter(UNKNOWN.removesuffix("_total"), "unknown", ["provider", "model"])
    pricer = Pricer(CostConfig(), counter)
    for _ in range(2):
        s = llm("openai", "gpt-nonexistent-9", 10, 10)
        pricer.price(s)
        assert s.cost_usd is None
    assert metrics.registry.get_sample_value(UNKNOWN, {"provider": "openai", "model": "gpt-nonexistent-9"}) == 2
    for i in range(MAX_UNKNOWN_LABELS + 5):
        pricer.price(llm("acme", f"model-{i}", 10, 10))
    assert metrics.registry.get_sample_value(UNKNOWN, {"provider": "other", "model": "other"}) == 6
    series = {
        (s.labels["provider"], s.labels["model"])
        for m in metrics.registry.collect()
        if m.name == UNKNOWN.removesuffix("_total")
        for s in m.samples
        if s.name == UNKNOWN
    }
    assert len(series) == MAX_UNKNOWN_LABELS + 1


def test_a_batch_counts_each_unpriced_span_and_prices_the_rest() -> None:
    class Sink:
        async def consume(self, batch: SpanBatch) -> None:
            self.batch = batch

    def chat(model: str) -> Span:
        s = Span("ab" * 16, "cd" * 8, "", "chat", "CLIENT", 0, 1)
        s.attributes = {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": "openai",
            "gen_ai.request.model": model,
            "gen_ai.usage.input_tokens": 1000,
            "gen_ai.usage.output_tokens": 500,
        }
        return s

    metrics = SelfMetrics()
    proc = Normalize(NormalizeConfig(), Settings("normalize", metrics, logging.getLogger("t")), Sink())  # type: ignore[arg-type]
    models = ["gpt-nonexistent-9", "gpt-4o-mini", "gpt-nonexistent-9", "acme-1", "gpt-nonexistent-9"]
    spans = [chat(m) for m in models]
    asyncio.run(proc.consume(SpanBatch(spans)))
    assert [s.cost_usd for s in spans] == [None, pytest.approx(0.00045), None, None, None]
    assert metrics.registry.get_sample_value(UNKNOWN, {"provider": "openai", "model": "gpt-nonexistent-9"}) == 3
    assert metrics.registry.get_sample_value(UNKNOWN, {"provider": "openai", "model": "acme-1"}) == 1
    asyncio.run(proc.consume(SpanBatch([chat("acme-1")])))
    assert metrics.registry.get_sample_value(UNKNOWN, {"provider": "openai", "model": "acme-1"}) == 2


def test_a_config_price_wins_over_the_table() -> None:
    prices = {
        "openai/gpt-4o-mini": {"input_per_mtok": 1.0, "output_per_mtok": 2.0, "cache_read_per_mtok": 0.5},
        "my-finetune": {"input_per_mtok": 3.0, "output_per_mtok": 4.0},
    }
    s = priced(llm("openai", "gpt-4o-mini", 1000, 1000, cache_read_input_tokens=400), {"prices": prices})
    assert s.cost_usd == pytest.approx((600 * 1.0 + 400 * 0.5 + 1000 * 2.0) / 1e6)
    # a bare model name prices it from any provider; its cache rate defaults to the input rate
    s = priced(llm("acme", "my-finetune", 1000, 1000, cache_read_input_tokens=400), {"prices": prices})
    assert s.cost_usd == pytest.approx((1000 * 3.0 + 1000 * 4.0) / 1e6)
    # another provider's gpt-4o-mini keeps the table's price
    s = priced(llm("azure.ai.openai", "gpt-4o-mini", 1000, 500), {"prices": prices})
    assert s.cost_usd == pytest.approx(0.00045)


def test_disabled_cost_leaves_spans_alone() -> None:
    class Sink:
        async def consume(self, batch: SpanBatch) -> None:
            self.batch = batch

    settings = Settings("normalize", SelfMetrics(), logging.getLogger("t"))
    for enabled, has_cost in ((True, True), (False, False)):
        chat = Span("ab" * 16, "cd" * 8, "", "chat", "CLIENT", 0, 1)
        chat.attributes = {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": "openai",
            "gen_ai.request.model": "gpt-4o-mini",
            "gen_ai.usage.input_tokens": 1000,
            "gen_ai.usage.output_tokens": 500,
        }
        proc = Normalize(NormalizeConfig(cost={"enabled": enabled}, event_wait=0), settings, Sink())  # type: ignore[arg-type]
        asyncio.run(proc.consume(SpanBatch([chat], revision=True)))
        assert (chat.cost_usd is not None) == has_cost
        if has_cost:
            assert chat.cost_usd == pytest.approx(0.00045)


def _config(normalize: dict[str, Any]) -> dict[str, Any]:
    return {
        "receivers": {"otlp": {}},
        "processors": {"normalize": normalize},
        "exporters": {"clickhouse": {}},
        "service": {
            "pipelines": {"traces": {"receivers": ["otlp"], "processors": ["normalize"], "exporters": ["clickhouse"]}}
        },
    }


def test_a_negative_price_is_a_config_error_naming_the_key() -> None:
    with pytest.raises(ConfigError) as e:
        parse_config(_config({"cost": {"prices": {"openai/gpt-x": {"input_per_mtok": -1, "output_per_mtok": 1}}}}))
    assert "processors.normalize.cost.prices.openai/gpt-x.input_per_mtok:" in str(e.value)
    with pytest.raises(ConfigError) as e:
        parse_config(_config({"cost": {"prices": {"gpt-x": {"input_per_mtok": 1}}}}))
    assert "processors.normalize.cost.prices.gpt-x.output_per_mtok:" in str(e.value)


def test_the_docs_cost_config_parses() -> None:
    section = DOCS.read_text().split("## Cost\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```yaml\n(.*?)```", section, re.S)
    assert blocks
    for block in blocks:
        doc = yaml.safe_load(block)
        doc.setdefault("receivers", {"otlp": {}})
        doc.setdefault("exporters", {"clickhouse": {}})
        doc.setdefault(
            "service",
            {
                "pipelines": {
                    "traces": {"receivers": ["otlp"], "processors": ["normalize"], "exporters": ["clickhouse"]}
                }
            },
        )
        cfg = parse_config(doc)
        assert cfg.component("processor", "normalize").cost.prices  # type: ignore[attr-defined]


def test_serve_stores_cost_and_the_trace_list_sums_it(tmp_path: Path) -> None:
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    c = start_collector(tmp_path, serve_config(tmp_path / "store"))
    try:
        provider = TracerProvider(resource=Resource.create({"service.name": "cost-test"}))
        provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=c.http + "/v1/traces")))
        tracer = provider.get_tracer("test.cost")
        with tracer.start_as_current_span("invoke_agent a") as agent:
            agent.set_attribute("gen_ai.operation.name", "invoke_agent")
            for tokens in ((1000, 500, 0), (2000, 100, 1500)):
                with tracer.start_as_current_span("chat gpt-4o-mini") as chat:
                    chat.set_attribute("gen_ai.operation.name", "chat")
                    chat.set_attribute("gen_ai.provider.name", "openai")
                    chat.set_attribute("gen_ai.request.model", "gpt-4o-mini")
                    chat.set_attribute("gen_ai.usage.input_tokens", tokens[0])
                    chat.set_attribute("gen_ai.usage.output_tokens", tokens[1])
                    chat.set_attribute("gen_ai.usage.cache_read.input_tokens", tokens[2])
        trace_id = format(agent.get_span_context().trace_id, "032x")
        provider.shutdown()
        assert c.wait_stored(3) == 3
        expected = 0.00045 + (500 * 0.15 + 1500 * 0.075 + 100 * 0.6) / 1e6

        def listed() -> dict[str, Any] | None:
            traces = httpx.get(c.api + "/api/v1/traces").json()["traces"]
            return next((t for t in traces if t["trace_id"] == trace_id and t.get("cost_usd")), None)

        assert wait_until(lambda: listed() is not None, timeout=20)
        row = listed()
        assert row is not None
        assert row["cost_usd"] == pytest.approx(expected, rel=1e-6)
    finally:
        c.stop()
