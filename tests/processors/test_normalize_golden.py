"""Normalize's output over every trace capture, as captured, as re-read from the store and made hostile, is the
output of the commit the golden file was made from (fd8146b): every field of every span, and the metrics."""

from __future__ import annotations

from normalize_golden import GOLDEN, captures, digests


def test_every_capture_normalizes_as_the_golden_file_says() -> None:
    golden = GOLDEN.read_text().splitlines()
    present = {name for name, _ in captures()}
    expected = [line for line in golden if line.split(" ", 1)[0] in present]
    found = digests()
    changed = sorted({line.rsplit(" ", 1)[0] for line in set(found) ^ set(expected)})
    # a differing span is named here; `python tests/processors/normalize_golden.py --text DIR` shows it in full
    assert not changed, changed[:20]
    assert len(found) == len(expected) and present
