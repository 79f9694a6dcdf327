"""Importers: results of other harnesses as evalsi runs."""
