"""Receivers: where spans and log records enter the pipeline."""
