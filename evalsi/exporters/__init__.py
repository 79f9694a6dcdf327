"""Exporters: where spans and scores leave the pipeline (the store, OTLP, Prometheus, Langfuse, MLflow)."""
