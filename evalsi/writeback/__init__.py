"""Exporters that write scores back to the tools people already look at (Langfuse, MLflow)."""

from evalsi.writeback import langfuse, mlflow  # noqa: F401
