"""`POST /v1/evaluate` under a deadline, on threads of its own: an evaluator that runs long is answered 504 while
health checks and other routes keep answering; past `EVALUATE_THREADS` running evaluations a request is refused
429 at once; evaluators not started by the deadline are error scores."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import httpx
import pytest

from evalsi.collector import score_api
from evalsi.collector.api import build_api
from evalsi.evaluators.base import evaluator
from evalsi.model.score import Score

RELEASE = threading.Event()
STARTED = threading.Semaphore(0)


@evaluator("test/held", requires=())
def _held(target: Any, params: Any) -> Score:
    """Runs until the test releases it (at most 10 s)."""
    STARTED.release()
    RELEASE.wait(10)
    return Score("held", value=1.0)


def _request(*refs: str) -> dict[str, Any]:
    return {"records": [{"output": "x"}], "evaluators": [{"ref": r} for r in refs]}


def test_evaluators_not_started_by_the_deadline_are_error_scores() -> None:
    plan = score_api.plan_evaluation(_request("builtin/json-valid", "builtin/json-valid"))
    answer = score_api.evaluate(plan, None, deadline=time.monotonic() - 1)
    scores = answer["results"][0]["scores"]
    assert [(s["outcome"], s["reason"]) for s in scores] == [("error", "deadline exceeded")] * 2
    assert scores[0]["evaluator"] == "builtin/json-valid"
    assert "deadline" in scores[0]["explanation"]
    # without a deadline passed, the same plan is scored
    assert score_api.evaluate(plan, None)["results"][0]["scores"][0]["outcome"] == "scored"


def test_a_runaway_evaluator_gets_504_and_holds_no_other_route(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(score_api, "EVALUATE_DEADLINE_S", 1.0)
    RELEASE.clear()
    app = build_api(None, status=dict)

    async def main() -> None:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://evalsi") as client:
            held = [asyncio.create_task(client.post("/v1/evaluate", json=_request("test/held")))
                    for _ in range(score_api.EVALUATE_THREADS)]  # fmt: skip
            for _ in held:  # both evaluations are running
                assert await asyncio.to_thread(STARTED.acquire, True, 10)
            # every evaluation thread is taken: the next request is refused at once, health still answers
            busy = await client.post("/v1/evaluate", json=_request("builtin/json-valid"))
            assert busy.status_code == 429 and busy.headers["retry-after"] == "1", busy.text
            health = await client.get("/healthz")
            assert health.status_code == 200
            answers = await asyncio.gather(*held)
            assert [r.status_code for r in answers] == [504] * score_api.EVALUATE_THREADS
            assert "deadline" in answers[0].json()["detail"]
            assert not RELEASE.is_set()  # answered at the deadline: the evaluators are still held
            # the runaway evaluations still hold their threads: refused until they return
            assert (await client.post("/v1/evaluate", json=_request("builtin/json-valid"))).status_code == 429
            RELEASE.set()
            deadline = time.monotonic() + 5
            while True:
                r = await client.post("/v1/evaluate", json=_request("builtin/json-valid"))
                if r.status_code != 429 or time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.05)
            assert r.status_code == 200, r.text
            assert r.json()["results"][0]["scores"][0]["outcome"] == "scored"

    try:
        asyncio.run(main())
    finally:
        RELEASE.set()
