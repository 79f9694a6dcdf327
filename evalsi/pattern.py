"""Regular expressions that come from outside (policies, evaluator parameters in API requests, configs): compiled with
RE2 (google-re2), so a match takes time linear in the text whatever the pattern. Python's `re` backtracks: `(a+)+$`
over 40 characters runs for hours and holds the GIL meanwhile.

RE2's syntax is Python's without what needs backtracking: no backreferences (`\\1`, `(?P=name)`), no lookahead or
lookbehind (`(?=`, `(?!`, `(?<=`, `(?<!`), no possessive or atomic groups; `\\d`, `\\w`, `\\s` and `\\b` are ASCII
(use `\\pN`, `\\pL` for Unicode classes). A pattern RE2 cannot take is refused where it is given, with RE2's reason.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any, Protocol

SYNTAX_NOTE = "RE2 syntax: no backreferences or lookaround; \\d \\w \\s are ASCII"


class PatternError(ValueError):
    """A pattern RE2 refuses, with its reason."""


class Pattern(Protocol):
    """What evalsi asks of a compiled pattern."""

    pattern: str

    def search(self, text: str) -> Any: ...

    def fullmatch(self, text: str) -> Any: ...


@lru_cache(maxsize=1024)
def compile_pattern(pattern: str, *, ignore_case: bool = False, multiline: bool = False) -> Pattern:
    """`pattern` compiled with RE2 (cached); `multiline`: `^` and `$` match at line boundaries. Raises PatternError."""
    import re2

    options = re2.Options()
    options.log_errors = False  # the reason is raised, not printed to stderr by RE2
    options.case_sensitive = not ignore_case
    try:
        return re2.compile(("(?m)" if multiline else "") + pattern, options=options)
    except re2.error as e:
        reason = e.args[0] if e.args else e
        text = reason.decode("utf-8", "replace") if isinstance(reason, bytes) else str(reason)
        raise PatternError(f"invalid regular expression {pattern[:200]!r}: {text} ({SYNTAX_NOTE})") from None
