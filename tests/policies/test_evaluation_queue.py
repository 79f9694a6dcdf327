"""The evaluation queue's engine thread takes works a chunk at a time (`EvaluationQueue.evaluate_all`): the scores,
their order and projects, the policies' stats and window records, and the counters it keeps are those of the works
evaluated one at a time."""

from __future__ import annotations

import logging
import random
from pathlib import Path
from typing import Any

import yaml
from policy_helpers import fixture_spans, span

from evalsi.collector.builtin import load_builtin_components
from evalsi.component import REGISTRY, Next, Settings
from evalsi.model.score import Score, score_rows, scores_from_rows
from evalsi.model.span import Span
from evalsi.processors.evaluate.work_queue import EvaluationQueue, Work
from evalsi.runtime.telemetry import SelfMetrics

POLICIES = [
    {"name": "support", "selector": "trace.service_name == 'support-bot' || span.attributes['route'] == 'a'",
     "sampling": {"rate": 1.0},
     "cascade": [{"ref": "builtin/latency", "params": {"max_ms": 500}}, {"ref": "builtin/tokens"},
                 {"ref": "builtin/cost"}]},
    {"name": "sampled", "selector": "trace.llm_calls > 0", "sampling": {"rate": 0.5},
     "cascade": [{"ref": "builtin/latency", "params": {"max_ms": 100}},
                 {"ref": "builtin/tokens", "when": "scores.latency.passed == false"}],
     "promote": {"when": "scores.latency.passed == true", "dataset": "fast"}},
]  # fmt: skip


def _queue(tmp: Path, metrics: SelfMetrics) -> EvaluationQueue:
    load_builtin_components()
    files = []
    for p in POLICIES:
        spec = {k: v for k, v in p.items() if k != "name"}
        path = tmp / f"{p['name']}.yaml"
        doc = {"apiVersion": "evals.si/v1alpha1", "kind": "OnlineEvalPolicy", "metadata": {"name": p["name"]}}
        path.write_text(yaml.safe_dump({**doc, "spec": spec}))
        files.append(str(path))
    factory = REGISTRY[("processor", "evaluate")]
    config = factory.config(policies=files, datasets_dir=str(tmp / "datasets"), project="team-a")
    processor = factory.cls(config, Settings(id="evaluate", metrics=metrics, logger=logging.getLogger("t")), Next())
    processor.queue.policies.record_windows()  # as a pipeline worker: the records show what the windows got
    return processor.queue


def _traces() -> list[list[Span]]:
    rng = random.Random(3)
    out = [fixture_spans("crewai", "chat_tools"), fixture_spans("crewai", "chat_error")]
    for n in range(60):
        tid = f"{n + 1:032x}"
        out.append(
            [
                span(tid, "r" * 16, duration_ms=rng.choice([50, 300, 900]),
                     service_name=rng.choice(["support-bot", "x"]), attributes={"route": rng.choice(["a", "b"])},
                     output_tokens=rng.choice([None, 12])),
                span(tid, "c" * 16, parent="r" * 16, duration_ms=20, output_tokens=rng.choice([None, 30])),
            ]
        )  # fmt: skip
    return out


def _seen(queue: EvaluationQueue, scores: list[Any], metrics: SelfMetrics) -> dict[str, Any]:
    rows = [{k: v for k, v in s.as_dict().items() if k != "timestamp_unix_nano"} for s in scores]
    records = [
        (r.policy, r.trace_id, r.new_trace, [s.name for s in r.scores]) for r in queue.policies.drain_window_records()
    ]
    samples = {
        (m.name, tuple(sorted(s.labels.items()))): s.value
        for m in metrics.registry.collect()
        if m.name.startswith("evalsi_evaluate") and "seconds" not in m.name
        for s in m.samples
        if not s.name.endswith("_created")
    }
    latency = [
        s.value for m in metrics.registry.collect() for s in m.samples if s.name == "evalsi_evaluate_seconds_count"
    ]
    stats = {name: st.as_dict() for name, st in queue.policies.stats.items()}
    return {"scores": rows, "records": records, "metrics": samples, "latency_count": latency, "stats": stats}


def test_a_chunk_gives_what_the_works_one_at_a_time_give(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    chunked_metrics, single_metrics = SelfMetrics(), SelfMetrics()
    chunked, single = _queue(tmp_path / "a", chunked_metrics), _queue(tmp_path / "b", single_metrics)
    traces = _traces()
    works = [Work("trace", spans, 1.0) for spans in traces]
    got = chunked.evaluate_all(works)
    want = [s for w in [Work("trace", spans, 1.0) for spans in traces] for s in single.evaluate(w)]
    assert got and {s.project for s in got} == {"team-a"}
    assert {s.policy for s in got} == {"support", "sampled"}
    a, b = _seen(chunked, got, chunked_metrics), _seen(single, want, single_metrics)
    assert a == b
    assert a["latency_count"] == [len(traces)]


def test_scores_cross_to_the_collector_process_as_they_were(tmp_path: Path) -> None:
    """A worker hands its scores on as plain tuples (`score_rows`): every field, in field order, and back."""
    got = _queue(tmp_path, SelfMetrics()).evaluate_all([Work("trace", spans, 1.0) for spans in _traces()])
    rows = score_rows(got)
    assert rows == [tuple(getattr(s, f) for f in Score.__dataclass_fields__) for s in got]
    assert scores_from_rows(rows) == got


def test_the_queue_size_gauge_reads_what_waits(tmp_path: Path) -> None:
    metrics = SelfMetrics()
    queue = _queue(tmp_path, metrics)

    def size() -> float | None:
        return metrics.registry.get_sample_value("evalsi_evaluate_queue_size", {"processor": "evaluate"})

    assert size() == 0
    for spans in _traces()[:3]:
        queue.enqueue("trace", spans)
    assert size() == 3
    queue._queue.popleft()  # as the work loop takes a chunk
    assert size() == 2
