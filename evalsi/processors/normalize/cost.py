"""Cost of a GenAI span: `cost_usd` from its provider, model and token counts, priced with genai-prices' table.

The table (https://github.com/pydantic/genai-prices) ships inside the wheel and is read offline: evalsi never
starts its `UpdatePrices` fetcher, so prices change only when the package is upgraded. Config prices
(`cost.prices`) win over the table. A span whose mapper found a cost (`llm.cost.total`, `gen_ai.usage.cost`, ...)
keeps it.

Prices are looked up once per (provider, model) and cached; a span then costs a dict lookup and a few
multiplications.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from evalsi.model.span import Span

__all__ = ["CostConfig", "PriceOverride", "Pricer", "Rates", "library_rates", "span_cost"]

MAX_UNKNOWN_LABELS = 100
"""Distinct (provider, model) label pairs the unknown-model counter keeps; later ones count as `other`."""
MAX_CACHED = 10_000
"""(provider, model) pairs whose price lookup is kept; the cache starts over when full (hostile model names)."""

# OTel `gen_ai.provider.name` / `gen_ai.system` values genai-prices' own matching does not know
PROVIDER_ALIASES = {"gcp.gen_ai": "google", "x_ai": "x-ai", "azure.ai.inference": None, "ibm.watsonx.ai": None}

# genai-prices provider ids whose API reports input tokens without the cached ones (Anthropic's `input_tokens`,
# Bedrock Converse's `inputTokens`); every other provider (OpenAI's `prompt_tokens`, Gemini's
# `promptTokenCount`, ...) counts cache reads and writes inside the input tokens
CACHE_OUTSIDE_INPUT = frozenset({"anthropic", "aws", "aws.bedrock"})


class PriceOverride(BaseModel):
    """One model's prices in USD per million tokens; cache rates default to the input rate."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    input_per_mtok: float = Field(ge=0, allow_inf_nan=False)
    output_per_mtok: float = Field(ge=0, allow_inf_nan=False)
    cache_read_per_mtok: float | None = Field(None, ge=0, allow_inf_nan=False)
    cache_write_per_mtok: float | None = Field(None, ge=0, allow_inf_nan=False)


class CostConfig(BaseModel):
    """The normalize processor's `cost` section."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = True
    """Fill `cost_usd` of spans that have none from the price table."""
    prices: dict[str, PriceOverride] = {}
    """Prices by `<provider>/<model>` (or `<model>` for any provider), winning over the table."""


# a rate: USD per million tokens, flat or tiered ((base, ((start, price), ...)): every token of a request whose
# input exceeds `start` costs `price`, as genai-prices prices long context)
Rate = float | tuple[float, tuple[tuple[int, float], ...]]


@dataclass(frozen=True, slots=True)
class Rates:
    """One model's resolved prices, and whether its provider counts cached tokens inside the input tokens."""

    input: Rate
    output: Rate
    cache_read: Rate
    cache_write: Rate
    cache_in_input: bool = True
    source: str = "table"


def _rate(value: Rate, total_input: int) -> float:
    if isinstance(value, float):
        return value
    base, tiers = value
    for start, price in reversed(tiers):
        if total_input > start:
            return price
    return base


def _number(value: Any) -> int:
    if type(value) is int:
        return value if value > 0 else 0
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def span_cost(rates: Rates, input_tokens: int, output_tokens: int, cache_read: int, cache_write: int) -> float:
    """USD for one call. `input_tokens` as the provider reported them: with the cached ones inside when
    `rates.cache_in_input` (unless the cached ones outnumber them, which says they are not)."""
    cached = cache_read + cache_write
    if rates.cache_in_input and cached <= input_tokens:
        uncached = input_tokens - cached
        total_input = input_tokens
    else:
        uncached = input_tokens
        total_input = input_tokens + cached
    # flat rates (most models) are read without a call
    read, write, inp, out = rates.cache_read, rates.cache_write, rates.input, rates.output
    return (
        uncached * (inp if type(inp) is float else _rate(inp, total_input))
        + cache_read * (read if type(read) is float else _rate(read, total_input))
        + cache_write * (write if type(write) is float else _rate(write, total_input))
        + output_tokens * (out if type(out) is float else _rate(out, total_input))
    ) / 1_000_000


def _from_library(value: Any) -> Rate | None:
    if value is None:
        return None
    if isinstance(value, Decimal):
        return float(value)
    return (float(value.base), tuple((int(t.start), float(t.price)) for t in value.tiers))


def library_rates(provider: str | None, model: str, when: datetime | None = None) -> Rates | None:
    """The genai-prices table's rates for `model` (of `provider`, when the table knows it), or None."""
    from genai_prices.data_snapshot import find_provider_by_id, get_snapshot

    snapshot = get_snapshot()
    provider_id = None
    if provider:
        alias = PROVIDER_ALIASES.get(provider.lower(), provider)
        if alias is not None and find_provider_by_id(snapshot.providers, alias) is not None:
            provider_id = alias
    try:
        found, info = snapshot.find_provider_model(model, None, provider_id, None)
    except LookupError:
        return None
    prices = info.get_prices(when or datetime.now(UTC))
    input_rate = _from_library(prices.input_mtok)
    if input_rate is None:
        return None
    output_rate = _from_library(prices.output_mtok)
    cache_read = _from_library(prices.cache_read_mtok)
    cache_write = _from_library(prices.cache_write_mtok)
    return Rates(
        input=input_rate,
        output=0.0 if output_rate is None else output_rate,
        # a rate the table leaves out prices those tokens as input, as genai-prices does
        cache_read=input_rate if cache_read is None else cache_read,
        cache_write=input_rate if cache_write is None else cache_write,
        cache_in_input=found.id not in CACHE_OUTSIDE_INPUT,
        source=f"genai-prices:{found.id}/{info.id}",
    )


def _override_rates(provider: str | None, price: PriceOverride) -> Rates:
    return Rates(
        input=price.input_per_mtok,
        output=price.output_per_mtok,
        cache_read=price.input_per_mtok if price.cache_read_per_mtok is None else price.cache_read_per_mtok,
        cache_write=price.input_per_mtok if price.cache_write_per_mtok is None else price.cache_write_per_mtok,
        cache_in_input=(provider or "").lower() not in CACHE_OUTSIDE_INPUT,
        source="config",
    )


class Pricer:
    """Fills `cost_usd` of spans that have a model and token counts but no cost; counts models it cannot price."""

    def __init__(self, config: CostConfig, unknown_counter: Any = None) -> None:
        self.overrides = {key.lower(): value for key, value in config.prices.items()}
        self._unknown = unknown_counter
        self._labels: dict[tuple[str, str], Any] = {}  # the counter's child per (provider, model), looked up once
        self._unpriced: dict[tuple[str, str], int] = {}  # spans of this batch without a price, by (provider, model)
        self._cache: dict[tuple[str | None, str], Rates | None] = {}
        self._day = self._today()
        # the table (a 1.6 MB module) loads here, at startup, rather than under the first span
        from genai_prices import data  # noqa: F401

    @staticmethod
    def _today() -> int:
        return int(time.time() // 86_400)

    def rates(self, provider: str | None, model: str) -> Rates | None:
        key = (provider, model)
        try:
            return self._cache[key]
        except KeyError:
            pass
        if len(self._cache) >= MAX_CACHED:
            self._cache.clear()
        override = self.overrides.get(f"{provider}/{model}".lower()) or self.overrides.get(model.lower())
        if override is not None:
            rates: Rates | None = _override_rates(provider, override)
        else:
            try:
                rates = library_rates(provider, model)
            except Exception:  # a table entry the library cannot resolve: no price rather than a lost span
                rates = None
        self._cache[key] = rates
        return rates

    def new_batch(self) -> None:
        """Read the clock: dated price changes in the table take effect the day they start. Once a batch, so that
        `price_span` costs no clock read."""
        day = self._today()
        if day != self._day:
            self._day = day
            self._cache.clear()

    def end_batch(self) -> None:
        """Count the batch's spans left without a price: one counter increment a model rather than a span."""
        if self._unpriced:
            for (provider, model), spans in self._unpriced.items():
                self._count_unknown(provider, model, spans)
            self._unpriced.clear()

    def price(self, span: Span) -> None:
        """`price_span` as a batch of its own."""
        self.new_batch()
        self.price_span(span)
        self.end_batch()

    def price_span(self, span: Span) -> None:
        """Fill `cost_usd` of one span, with the prices of the day `new_batch` last saw; a span left without a
        price is counted at `end_batch`."""
        # model calls only: an agent span's token counts (the semconv's invoke_agent may carry them) sum its calls'
        if span.cost_usd is not None or not span.model or span.step_type not in ("llm", "embedding"):
            return
        input_tokens, output_tokens = span.input_tokens, span.output_tokens
        if input_tokens is None and output_tokens is None:
            return
        provider, model = span.provider, span.model
        rates = self.rates(provider, model)
        if rates is None:
            if self._unknown is not None:
                labels = (provider or "", model)
                self._unpriced[labels] = self._unpriced.get(labels, 0) + 1
            return
        details = span.details
        cost = span_cost(
            rates,
            _number(input_tokens),
            _number(output_tokens),
            _number(details.get("cache_read_input_tokens")) if details else 0,
            _number(details.get("cache_creation_input_tokens")) if details else 0,
        )
        if math.isfinite(cost):
            span.cost_usd = cost

    def _count_unknown(self, provider: str, model: str, spans: int) -> None:
        if self._unknown is None:
            return
        labels = (provider, model)
        child = self._labels.get(labels)
        if child is None:
            if len(self._labels) >= MAX_UNKNOWN_LABELS:
                labels = ("other", "other")
            child = self._labels[labels] = self._unknown.labels(*labels)
        child.inc(spans)
