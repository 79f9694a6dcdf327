"""The ports `evalsi serve` checks before it imports its components (`evalsi.runtime.ports.claimed`) are the ones the
validated config listens on (`config.listeners`), for every shape of config that sets one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from evalsi.auth import new_key
from evalsi.collector.config import DEFAULT_CONFIG, listeners, load_config, parse_config
from evalsi.runtime.ports import DEFAULT_LISTENING, claimed, claimed_in

ROOT = Path(__file__).resolve().parents[1]
_, KEY_HASH = new_key()

CONFIGS: dict[str, dict[str, Any]] = {
    "every listener set": {
        "receivers": {
            "otlp": {"protocols": {"grpc": {"endpoint": "127.0.0.1:14317"}, "http": {"endpoint": "127.0.0.1:14318"}}},
            "otlp/http-only": {"protocols": {"http": {"endpoint": "127.0.0.1:24318"}}},
            "otlp/grpc-listed": {"protocols": {"grpc": None}},
        },
        "exporters": {"clickhouse": {}, "prometheus": {}, "prometheus/2": {"endpoint": "127.0.0.1:19464"}},
        "service": {
            "pipelines": {
                "traces": {"receivers": ["otlp", "otlp/http-only", "otlp/grpc-listed"], "exporters": ["clickhouse"]},
                "scores": {"exporters": ["prometheus", "prometheus/2"]},
            },
            "api": {"endpoint": "127.0.0.1:18080"},
            "telemetry": {"metrics": {"address": "127.0.0.1:18888"}},
        },
    },
    "no metrics": {
        "receivers": {"otlp": {}},
        "exporters": {"clickhouse": {}},
        "service": {
            "pipelines": {"traces": {"receivers": ["otlp"], "exporters": ["clickhouse"]}},
            "telemetry": {"metrics": {"level": "none"}},
        },
    },
}


@pytest.mark.parametrize("name", CONFIGS)
def test_the_ports_checked_first_are_those_the_config_listens_on(name: str) -> None:
    config = parse_config(CONFIGS[name])
    assert sorted(claimed(CONFIGS[name])) == sorted(listeners(config.service, config.components))


def test_the_defaults_and_the_shipped_configs_too(monkeypatch: pytest.MonkeyPatch) -> None:
    defaults = load_config(None)
    assert sorted(claimed_in(None)) == sorted(listeners(defaults.service, defaults.components))
    assert claimed(DEFAULT_CONFIG) == claimed(DEFAULT_LISTENING)
    monkeypatch.setenv("EVALSI_API_KEY_HASH", KEY_HASH)
    path = ROOT / "deploy/evalsi.yaml"
    config = load_config(path)
    assert sorted(claimed_in(path)) == sorted(listeners(config.service, config.components))
