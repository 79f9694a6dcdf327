"""Exporters: where spans and scores leave the pipeline (stores, OTLP, Prometheus)."""

from evalsi.exporters import (
    clickhouse,  # noqa: F401
    otlp,  # noqa: F401
    prometheus,  # noqa: F401
)
