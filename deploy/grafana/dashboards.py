"""evalsi's Grafana dashboards, built as code with the Grafana Foundation SDK (`boards/`: a module per dashboard)
and checked in as JSON.

    python deploy/grafana/dashboards.py           # rewrite deploy/grafana/dashboards/*.json
    python deploy/grafana/dashboards.py --check   # exit 1 naming the files that differ from what this builds

Queries name only what evalsi writes: the tables of evalsi/exporters/clickhouse/schema.py and the metrics of the
collector's own /metrics (`service.telemetry.metrics`) and of the `prometheus` exporter. docs/grafana.md says what
each dashboard shows; tests/deploy/test_dashboards.py runs every query against a store and a Prometheus that a
real `evalsi serve` filled.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

# the dashboards' modules (`boards/`) sit beside this script, which runs as a script or is loaded from its path
sys.path.insert(0, str(Path(__file__).resolve().parent))

from boards.judge_spend import judge_spend
from boards.offline_runs import offline_runs
from boards.online_quality import mean_band_sql, online_quality
from boards.panels import PROMETHEUS
from boards.pipeline_health import pipeline_health
from boards.sql import FORMAT_TRACE, SqlQuery, t975_sql, trace_explore_url
from boards.worst_traces import worst_traces
from grafana_foundation_sdk.builders import dashboard as dashboard_b
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import dashboard

__all__ = [  # what the dashboards are made of, for the tests that run their queries
    "DASHBOARDS", "FORMAT_TRACE", "PROMETHEUS", "SqlQuery", "main", "mean_band_sql", "t975_sql", "trace_explore_url",
    "write",
]  # fmt: skip

OUT = Path(__file__).resolve().parent / "dashboards"


# --- writing -------------------------------------------------------------------------------------------------------

DASHBOARDS: dict[str, Callable[[], dashboard_b.Dashboard]] = {
    "pipeline-health.json": pipeline_health,
    "online-quality.json": online_quality,
    "judge-spend.json": judge_spend,
    "offline-runs.json": offline_runs,
    "worst-traces.json": worst_traces,
}


def build(builder: dashboard_b.Dashboard) -> dashboard.Dashboard:
    """The dashboard with every panel numbered (Grafana needs unique ids to repeat panels and to link to them)."""
    built = builder.build()
    next_id = 1
    for panel in built.panels or []:
        panel.id_val = next_id
        next_id += 1
        for inner in getattr(panel, "panels", None) or []:
            inner.id_val = next_id
            next_id += 1
    return built


def render(builder: dashboard_b.Dashboard) -> str:
    return json.dumps(build(builder), cls=JSONEncoder, indent=2, ensure_ascii=False) + "\n"


def rendered() -> dict[str, str]:
    return {name: render(make()) for name, make in DASHBOARDS.items()}


def stale(folder: Path) -> list[str]:
    """The dashboards in `folder` that differ from what this script builds, missing ones included."""
    return [n for n, text in rendered().items() if not (folder / n).is_file() or (folder / n).read_text() != text]


def strays(folder: Path) -> list[str]:
    """JSON files in `folder` that this script does not build (Grafana would load them too)."""
    return sorted(p.name for p in folder.glob("*.json") if p.name not in DASHBOARDS)


def write(folder: Path) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in rendered().items():
        path = folder / name
        path.write_text(text)
        written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if a file is stale")
    parser.add_argument("--dir", type=Path, default=OUT, help=f"where the JSON files are (default: {OUT})")
    args = parser.parse_args(argv)
    if args.check:
        found, extra = stale(args.dir), strays(args.dir)
        if found:
            print(
                f"stale dashboards in {args.dir}: {', '.join(found)}; run `python deploy/grafana/dashboards.py`",
                file=sys.stderr,
            )
        if extra:
            print(
                f"{args.dir} has dashboards this script does not build: {', '.join(extra)}; build them in "
                "deploy/grafana/dashboards.py (DASHBOARDS), or remove them",
                file=sys.stderr,
            )
        if found or extra:
            return 1
        print(f"{len(DASHBOARDS)} dashboards in {args.dir} are up to date")
        return 0
    for path in write(args.dir):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
