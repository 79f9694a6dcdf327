"""Receivers: where spans enter the pipeline."""

from evalsi.receivers import otlp  # noqa: F401
