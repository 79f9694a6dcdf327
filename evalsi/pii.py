"""PII detectors: the patterns and checks (Luhn, card issuers, phone digits, IBAN mod-97) that find emails, card
numbers, phone numbers, IP addresses and IBANs in text; redaction masks what they find, the safety pack reports it."""

from __future__ import annotations

import re

# A match may begin right after a JSON escape (`\n`, `\u00a0`) when the text is raw JSON (most content attributes
# are): the escape's letters would hide the word boundary the patterns start with, so the patterns take the
# escape in, and the rule masks what follows it.
_ESCAPE = r"(?:\\u[0-9A-Fa-f]{4}|\\[nrtbf])"
_LEADING_ESCAPE = re.compile(r"\\u[0-9A-Fa-f]{4}|\\[nrtbf]")


def _digit_patterns(boundary: str) -> tuple[str, str, str]:
    """The card, phone and IPv4 patterns, with `boundary` where they need a word boundary."""
    start = rf"(?:{_ESCAPE}|{boundary})"
    # 13-19 digits, single spaces or dashes between them; the Luhn check decides
    card = rf"{start}(?:\d[ -]?){{12,18}}\d{boundary}"
    phone = (
        r"\+\d{1,3}(?:[ .-]?\(?\d{1,4}\)?){2,5}"  # international: +1 415 555 0134, +44 20 7946 0958, +4930123456
        rf"|(?:\(\d{{3}}\) ?|{start}\d{{3}}[ .-])\d{{3}}[ .-]\d{{4}}{boundary}"  # North American: (415) 555-0134
        rf"|{start}0\d{{1,4}}(?:[ .-]?\d{{2,4}}){{2,4}}{boundary}"  # trunk prefix 0: 020 7946 0958, 030 1234567
    )
    octet = r"(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)"
    ipv4 = rf"{start}(?:{octet}\.){{3}}{octet}{boundary}"
    return card, phone, ipv4


EMAIL_PATTERN = rf"{_ESCAPE}?[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{{2,}}"
CARD_PATTERN, PHONE_PATTERN, IPV4_PATTERN = _digit_patterns(r"\b")
# The same without their word boundaries: each matches wherever its pattern does (a word boundary only narrows a
# match), and it runs in the regex engine's fast automaton on any text, where a Unicode `\b` on non-ASCII text does
# not. A text these do not match cannot hold a card, phone or IPv4 match.
CARD_SIEVE, PHONE_SIEVE, IPV4_SIEVE = _digit_patterns("")

_DIGITS = re.compile(r"\d+")
_NOT_DIGIT = re.compile(r"\D")
# first digits of the card networks' numbers (2 and 5 Mastercard, 3 Amex/Diners/JCB, 4 Visa, 6 Discover/UnionPay):
# 13-digit millisecond timestamps and most ids start with 1
_ISSUERS = frozenset("23456")
_DATE = re.compile(r"\d{1,2}[./-]\d{1,2}[./-]\d{2,4}")


def _after_escape(match: str) -> str:
    m = _LEADING_ESCAPE.match(match)
    return match[m.end() :] if m else match


def luhn(digits: str) -> bool:
    total = 0
    for i, c in enumerate(reversed(digits)):
        d = int(c)
        if i % 2:
            d = d * 2 - 9 if d > 4 else d * 2
        total += d
    return total % 10 == 0


def card_parts(match: str) -> list[str]:
    """The card number in a match: all of it if it is one (13-19 digits, a card network's first digit, the Luhn
    check), else the longest run of whole digit groups that is, e.g. in `12 4111 1111 1111 1111`; else nothing."""
    text = _after_escape(match)
    if _is_card(_NOT_DIGIT.sub("", text)):
        return [text]
    groups = [(m.start(), m.end()) for m in _DIGITS.finditer(text)]
    runs = sorted(
        ((i, j) for i in range(len(groups)) for j in range(i, len(groups)) if (i, j) != (0, len(groups) - 1)),
        key=lambda r: groups[r[0]][0] - groups[r[1]][1],
    )
    for i, j in runs:
        if _is_card("".join(text[a:b] for a, b in groups[i : j + 1])):
            return [text[groups[i][0] : groups[j][1]]]
    return []


def _is_card(digits: str) -> bool:
    return 13 <= len(digits) <= 19 and digits[0] in _ISSUERS and luhn(digits)


def phone_parts(match: str) -> list[str]:
    """A phone number has 9+ digits (8+ after a `+`) and is not a date such as 01.02.2024 12."""
    text = _after_escape(match)
    digits = sum(c.isdigit() for c in text)
    if digits >= 9 or (digits >= 8 and text.startswith("+")):
        return [] if _DATE.match(text) else [text]
    return []


def whole_match(match: str) -> list[str]:
    return [_after_escape(match)]


def as_is(match: str) -> list[str]:
    return [match]


IBAN_PATTERN = r"\b[A-Z]{2}\d{2}(?: ?[A-Z0-9]{4}){2,7}(?: ?[A-Z0-9]{1,3})?\b"


def iban_parts(match: str) -> list[str]:
    """The IBAN in a match (ISO 13616 mod-97 check, 15-34 characters), dropping trailing groups the pattern took
    from the words after it."""
    groups = match.split(" ")
    for end in range(len(groups), 0, -1):
        compact = "".join(groups[:end])
        if len(compact) < 15:
            break
        if len(compact) <= 34 and int("".join(str(int(c, 36)) for c in compact[4:] + compact[:4])) % 97 == 1:
            return [" ".join(groups[:end])]
    return []
