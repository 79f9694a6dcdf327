"""The built-in processors; importing this package registers them."""

from evalsi.processors import evaluate, normalize, probabilistic_sampler, redact, tail_sampling  # noqa: F401
