"""Every span of every trace capture, normalized and priced, as plain text, and the digests of that text that
`test_normalize_golden.py` compares with the golden file made from an earlier commit: a speed-up of normalize is
shown to change no field of any span.

`PYTHONPATH=<checkout> python tests/processors/normalize_golden.py` rewrites the golden file from that checkout;
with `--text DIR` it writes the full text instead (one file a capture), to diff two checkouts' outputs.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import random
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

TESTS = Path(__file__).resolve().parents[1]
FIXTURES = [TESTS / "fixtures", TESTS.parent.parent / "shared" / "fixtures"]
GOLDEN = Path(__file__).resolve().parent / "golden" / "normalize.sha256"


def captures() -> list[tuple[str, Path]]:
    """(name, path) of every OTLP trace capture (protobuf): tests/fixtures, then the shared ones it lacks."""
    found: dict[str, Path] = {}
    for root in FIXTURES:
        if not root.is_dir():
            continue
        for path in sorted(root.rglob("*.pb")):
            if path.name.endswith(".logs.pb"):
                continue
            name = str(path.relative_to(root).with_suffix("")).replace("/", "__")
            found.setdefault(name, path)
    return sorted(found.items())


def plain(value: Any) -> Any:
    """`value` as JSON-ready data that keeps what JSON loses: key order stays, tuples and floats are tagged."""
    if value is None or isinstance(value, (str, bool, int)):
        return value
    if isinstance(value, float):
        return {"float": repr(value)} if not math.isfinite(value) or value.is_integer() else value
    if isinstance(value, dict):
        return {"dict": [[plain(k), plain(v)] for k, v in value.items()]}
    if isinstance(value, list):
        return [plain(v) for v in value]
    if isinstance(value, tuple):
        return {"tuple": [plain(v) for v in value]}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {type(value).__name__: {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}}
    return {type(value).__name__: repr(value)}


def variants(spans: list[Any]) -> Iterator[tuple[str, Any]]:
    """Each span as captured, as re-read from the store (attribute values as strings), and hostile: a seeded third
    of its attributes dropped, JSON values cut short, numbers as negative or past every range."""
    from evalsi.exporters.clickhouse.rows import attribute_string

    rng = random.Random(35)
    for span in spans:
        yield "captured", span
        stored = dataclasses.replace(span, attributes={k: attribute_string(v) for k, v in span.attributes.items()})
        yield "stored", stored
        hostile: dict[str, Any] = {}
        for key, value in span.attributes.items():
            roll = rng.random()
            if roll < 0.3:
                continue
            if isinstance(value, str) and value[:1] in ("[", "{") and roll < 0.6:
                value = value[: len(value) // 2]
            elif isinstance(value, int) and not isinstance(value, bool) and roll < 0.6:
                value = -value if roll < 0.45 else value * 10**30
            elif isinstance(value, float) and roll < 0.6:
                value = math.nan if roll < 0.45 else -math.inf
            hostile[key] = value
        yield "hostile", dataclasses.replace(span, attributes=hostile)


def normalized_lines(path: Path) -> list[tuple[str, str]]:
    """(variant, text) of each span of the capture at `path` normalized by the normalize processor with its default
    config, and ("metrics", the processor's metrics) last."""
    import asyncio
    import logging

    from evalsi.component import Settings
    from evalsi.model.span import SpanBatch
    from evalsi.processors.normalize import Normalize, NormalizeConfig
    from evalsi.receivers.otlp.decode import decode_traces_protobuf
    from evalsi.runtime.telemetry import SelfMetrics

    class Sink:
        traces = None
        logs = None

        async def consume(self, batch: SpanBatch) -> None:
            pass

    decoded = decode_traces_protobuf(path.read_bytes())
    metrics = SelfMetrics()
    processor = Normalize(NormalizeConfig(), Settings("normalize", metrics, logging.getLogger("golden")), Sink())
    lines = []
    for kind, span in list(variants(list(decoded.batch.spans))):  # every variant made before any is normalized
        asyncio.run(processor.consume(SpanBatch([span])))
        lines.append((kind, json.dumps(plain(span), ensure_ascii=False)))
    samples = [
        [s.name, s.labels, plain(s.value)]
        for family in metrics.registry.collect()
        if family.name.startswith("evalsi_normalize")
        for s in family.samples
        if not s.name.endswith("_created")
    ]
    lines.append(("metrics", json.dumps(sorted(samples, key=json.dumps), ensure_ascii=False)))
    return lines


def digests() -> list[str]:
    """`<capture> <line> <variant> <sha256 of the text>`, a line for each span of every capture (the golden file)."""
    return [
        f"{name} {i} {kind} {hashlib.sha256(text.encode()).hexdigest()[:20]}"
        for name, path in captures()
        for i, (kind, text) in enumerate(normalized_lines(path))
    ]


def main(argv: list[str]) -> int:
    if argv[:1] == ["--text"]:
        out = Path(argv[1])
        out.mkdir(parents=True, exist_ok=True)
        for name, path in captures():
            (out / f"{name}.jsonl").write_text("".join(f"{kind} {text}\n" for kind, text in normalized_lines(path)))
        return 0
    GOLDEN.parent.mkdir(parents=True, exist_ok=True)
    GOLDEN.write_text("\n".join(digests()) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
