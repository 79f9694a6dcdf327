"""The self-metrics of the collector process and its pipeline workers, merged into one exposition."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import Metric


class MergedMetrics:
    """Self-metrics of the collector process and its workers as one exposition: series of the same name and labels
    are summed (each process counts only what it did)."""

    def __init__(self, *sources: Any) -> None:
        self._sources = sources

    def collect(self) -> Iterable[Metric]:
        families: dict[str, Metric] = {}
        index: dict[tuple[str, tuple[tuple[str, str], ...]], int] = {}
        for source in self._sources:
            for fam in source.collect():
                merged = families.get(fam.name)
                if merged is None:
                    merged = families[fam.name] = Metric(fam.name, fam.documentation, fam.type, fam.unit)
                for sample in fam.samples:
                    key = (sample.name, tuple(sorted(sample.labels.items())))
                    at = index.get(key)
                    if at is None:
                        index[key] = len(merged.samples)
                        merged.samples.append(sample)
                    else:
                        old = merged.samples[at]
                        merged.samples[at] = old._replace(
                            value=old.value + sample.value, exemplar=sample.exemplar or old.exemplar
                        )
        return list(families.values())


def merged_registry(*sources: Any) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(MergedMetrics(*sources))  # type: ignore[arg-type]
    return registry
