"""How many inputs the property and fuzz tests try: the `ci` Hypothesis profile's budget (every run, seconds), or
the `deep` profile's (`HYPOTHESIS_PROFILE=deep`: ten times as far, minutes; README says how to run it)."""

from __future__ import annotations

import os

PROFILES = ("ci", "deep")
PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "ci")
if PROFILE not in PROFILES:
    raise RuntimeError(f"HYPOTHESIS_PROFILE={PROFILE!r}: choose one of {', '.join(PROFILES)}")


def examples(ci: int, deep: int) -> int:
    """The number of examples of the profile in use."""
    return deep if PROFILE == "deep" else ci
