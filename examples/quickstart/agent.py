"""The quickstart's agent, as a plain Python callable: a few rules and the weather tool, with its steps returned
so evalsi traces them (`evalsi run` records them as `chat` and `execute_tool` spans)."""

import re
import time

from tools import get_weather

CITIES = ("Paris", "Oslo", "Lima", "Cairo")


def answer(question: str) -> dict:
    steps = []
    cities = [c for c in CITIES if c.lower() in question.lower()]
    if "weather" in question.lower() and cities:
        parts = []
        for city in cities:
            start = time.time_ns()
            result = get_weather(city)
            steps.append({"type": "tool", "name": "get_weather", "arguments": {"city": city}, "result": result,
                          "start_ns": start, "end_ns": time.time_ns()})
            parts.append(f"The weather in {city} is {result}.")
        return {"output": " ".join(parts), "trajectory": steps}
    m = re.search(r"(\d+)\s*([+*-])\s*(\d+)", question)
    if m:
        a, op, b = int(m.group(1)), m.group(2), int(m.group(3))
        return {"output": str(a + b if op == "+" else a * b if op == "*" else a - b), "trajectory": steps}
    return {"output": "I don't know.", "trajectory": steps}
