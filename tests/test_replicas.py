"""The replica set (`replicas:` in the evaluate processor's config): the config refuses what would leave a replica
owning nothing, every replica picks the same owner of a session, a change of members moves only the sessions of the
member that went, and a DNS name's answers are the members (a failed resolution keeps the last set)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError
from running_collector import EVALSI, serve_config

from evalsi.processors.evaluate import EvaluateConfig
from evalsi.replicas import Membership, ReplicasConfig, rendezvous_owner, resolve_a_records


def _config(**replicas: object) -> EvaluateConfig:
    return EvaluateConfig.model_validate({"replicas": replicas})


def test_the_config_takes_a_static_list_or_a_dns_name() -> None:
    static = _config(self="b", static=["a", "b", "c"]).replicas
    assert static is not None and (static.self_, static.static, static.dns) == ("b", ["a", "b", "c"], None)
    dns = _config(**{"self": "10.0.0.7", "dns": "evalsi-headless.evalsi.svc.cluster.local", "resolve_interval": "2s"})
    assert dns.replicas is not None and dns.replicas.resolve_interval == 2.0
    assert EvaluateConfig().replicas is None  # the default: one process owns every budget and session


@pytest.mark.parametrize(
    ("replicas", "message"),
    [
        ({"self": "a", "static": ["a"], "members": ["a"]}, "replicas.members"),  # unknown key, named with its path
        ({"self": "a"}, "one of `static: [names]` or `dns: name`"),
        ({"self": "a", "static": ["a"], "dns": "x"}, "one of `static: [names]` or `dns: name`"),
        ({"self": "d", "static": ["a", "b"]}, "static does not list self ('d')"),
        ({"self": "a", "static": []}, "an empty replica set"),
        ({"static": ["a"]}, "replicas.self"),
        ({"self": "a", "static": ["a"], "budget_slice": 0}, "replicas.budget_slice"),
    ],
)
def test_the_config_refuses_what_would_leave_a_replica_owning_nothing(replicas: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError) as e:
        _config(**replicas)
    text = str(e.value)
    assert message in text or message.replace(".", "\n  ", 1) in text, text


def test_every_replica_picks_the_same_owner_and_a_leaving_member_moves_only_its_sessions() -> None:
    members = ("10.0.0.1", "10.0.0.2", "10.0.0.3")
    sessions = [f"conv-{n}" for n in range(600)]
    owners = {s: rendezvous_owner(members, "acme", s) for s in sessions}
    assert owners == {s: rendezvous_owner(tuple(reversed(members)), "acme", s) for s in sessions}  # order-free
    counts = {m: sum(1 for o in owners.values() if o == m) for m in members}
    assert all(150 <= n <= 250 for n in counts.values()), counts  # spread about evenly
    after = {s: rendezvous_owner(members[:2], "acme", s) for s in sessions}
    moved = {s for s in sessions if after[s] != owners[s]}
    assert moved == {s for s in sessions if owners[s] == "10.0.0.3"}
    # the project is part of the key: another project's session of the same id may have another owner
    assert any(rendezvous_owner(members, "other", s) != owners[s] for s in sessions)
    assert rendezvous_owner((), "acme", "conv-1") is None


def test_membership_from_dns_follows_its_answers_and_keeps_the_last_on_failure() -> None:
    answers: list[object] = [["10.0.0.2", "10.0.0.1"], OSError("no such host"), [], ["10.0.0.2"]]

    def resolve(name: str) -> list[str]:
        assert name == "evalsi-headless"
        answer = answers.pop(0)
        if isinstance(answer, OSError):
            raise answer
        return answer  # type: ignore[return-value]

    config = ReplicasConfig.model_validate({"self": "10.0.0.1", "dns": "evalsi-headless"})
    m = Membership(config, resolve=resolve)
    assert m.members == () and m.size == 1 and not m.owns("acme", "conv-1")
    assert m.refresh() and m.members == ("10.0.0.1", "10.0.0.2")
    assert not m.refresh() and m.members == ("10.0.0.1", "10.0.0.2")  # the failure keeps the set
    assert not m.refresh() and m.members == ("10.0.0.1", "10.0.0.2")  # so does an empty answer
    assert m.refresh() and m.members == ("10.0.0.2",)  # this replica left: it owns nothing
    assert not any(m.owns("acme", f"conv-{n}") for n in range(50))


def test_a_real_name_resolves_to_its_a_records() -> None:
    assert resolve_a_records("localhost") == ["127.0.0.1"]


def test_replicas_without_a_store_refuse_to_start_naming_the_key(tmp_path: Path) -> None:
    (tmp_path / "p.yaml").write_text(
        "apiVersion: evals.si/v1alpha1\nkind: OnlineEvalPolicy\nmetadata: {name: p}\nspec:\n  cascade:\n"
        "    - ref: builtin/session-turns\n"
    )
    config = serve_config(tmp_path / "unused")
    config["exporters"] = {"otlp": {"endpoint": "http://127.0.0.1:9"}}
    config["processors"] = {
        "tail_sampling": {},
        "evaluate": {"policies": ["p.yaml"], "replicas": {"self": "a", "static": ["a"]}},
    }
    config["service"]["pipelines"] = {
        "traces": {"receivers": ["otlp"], "processors": ["tail_sampling", "evaluate"], "exporters": ["otlp"]},
        "scores": {"exporters": ["otlp"]},
    }
    (tmp_path / "evalsi.yaml").write_text(yaml.safe_dump(config))
    res = subprocess.run([*EVALSI, "serve", "-c", "evalsi.yaml"], cwd=tmp_path, capture_output=True, text=True,
                         timeout=120)  # fmt: skip
    assert res.returncode != 0
    assert "processors.evaluate: replicas: replicas share judge budgets and sessions through the store" in res.stderr
