"""Online policies (OnlineEvalPolicy): CEL selectors, sampling, cascades of evaluators, windows, alerts, promotion."""

from evalsi.policies.engine import PolicySet
from evalsi.policies.load import PolicyError, load_policies
from evalsi.policies.model import OnlineEvalPolicy
from evalsi.policies.notify import AlertEvent, AlertRecorder, Notifier
from evalsi.policies.policy import Policy, PolicyStats, sampling_hash
from evalsi.policies.store_window import StoreWindows
from evalsi.policies.window import WindowStats

__all__ = [
    "AlertEvent", "AlertRecorder", "Notifier", "OnlineEvalPolicy", "Policy", "PolicyError", "PolicySet", "PolicyStats",
    "StoreWindows", "WindowStats", "load_policies", "sampling_hash",
]  # fmt: skip
