"""Exporters that write scores back to the tools people already look at (Langfuse, ...)."""

import evalsi.writeback.langfuse  # noqa: F401
