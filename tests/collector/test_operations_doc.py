"""docs/operations.md as an operator uses it: its config blocks are taken by evalsi's parser, with the values the page
describes, and the refusals it lists are the ones the receivers answer."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from evalsi.collector.config import parse_config

ROOT = Path(__file__).resolve().parents[2]
TEXT = (ROOT / "docs" / "operations.md").read_text()
AROUND: dict[str, Any] = {
    "receivers": {"otlp": {}},
    "exporters": {"clickhouse": {}},
    "service": {"pipelines": {"traces": {"receivers": ["otlp"], "exporters": ["clickhouse"]}}},
}


def _merged(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in extra.items():
        out[k] = _merged(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def test_every_config_block_is_taken_as_described() -> None:
    blocks = re.findall(r"```yaml\n(.*?)```", TEXT, re.S)
    assert blocks, "the page shows the durability config"
    for block in blocks:
        assert block.startswith("# evalsi"), block
        config = parse_config(_merged(AROUND, yaml.safe_load(block)))
        durability = config.service.durability
        assert durability.mode == "wal"
        assert durability.directory == "/var/lib/evalsi/wal"
        assert durability.max_size_mib == 1024


def test_the_segment_rules_the_page_states_are_the_code() -> None:
    from evalsi import wal

    assert "closed after 32 MiB or a second" in TEXT
    assert wal.SEGMENT_BYTES == 32 * 1024 * 1024 and wal.SEGMENT_SECONDS == 1.0
    assert "`.evalsi/wal`" in (ROOT / "docs" / "configuration.md").read_text()
    assert wal.DurabilityConfig().directory == ".evalsi/wal" and wal.DurabilityConfig().max_size_mib == 1024
