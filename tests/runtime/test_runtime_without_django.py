"""The runtime runs where Django cannot even be imported, and reaches a ctxlens server over OTLP.

A child Python process blocks every server-side package (Django, DRF, Channels) before it
imports anything, runs a tool loop with pipeline.runtime (the scripted fake chat model, a tool
call, a large result kept in the agent's own artifact store and read back), and exports its
spans with the OpenTelemetry SDK's OTLP/HTTP exporter to a live ctxlens with an ingest key,
configured only through CTXLENS_* environment variables. The test then finds the conversation
through the read API with a read key.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from urllib.parse import quote

import pytest
import requests

from pipeline.models import ApiKey
from pipeline.models.apikeys import Scope

ROOT = Path(__file__).resolve().parents[2]

CHILD = r'''
import importlib.abc
import json
import sys

BLOCKED = {"django", "rest_framework", "channels", "daphne", "drf_spectacular"}


class BlockServer(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"{name} is blocked: the runtime must not need it", name=name)
        return None


sys.meta_path.insert(0, BlockServer())
try:
    import django  # noqa: F401
except ImportError:
    pass
else:
    raise SystemExit("django is importable in the child")

from langchain_core.messages import HumanMessage
from langchain_core.tools import tool

from pipeline.runtime.agent import run_agent
from pipeline.runtime.artifact_tool import read_artifact_tool
from pipeline.runtime.artifacts import LocalArtifactStore
from pipeline.runtime.demo.fake_model import ScriptedChatModel, calls, tool_call
from pipeline.runtime.settings import runtime_settings
from pipeline.runtime.telemetry.spans import Telemetry

conversation_id = sys.argv[1]


@tool
def weather(city: str) -> str:
    """Today's weather in a city."""
    return f"{city}: sunny, 21 C"


@tool
def station_log(city: str) -> str:
    """The weather station's full hourly log."""
    return "\n".join(f"{city} {hour:02d}:00 21 C wind 3 m/s" for hour in range(24))


store = LocalArtifactStore()
model = ScriptedChatModel.from_script([
    calls(tool_call("weather", {"city": "Paris"}, "call_weather_1")),
    calls(tool_call("station_log", {"city": "Paris"}, "call_log_1")),
    lambda messages: calls(tool_call(
        "read_artifact", {"artifact_id": messages[-1].content.split("artifact: ")[1].split()[0], "limit": 40},
        "call_read_1",
    )),
    "It is sunny and 21 C in Paris, and the station logged the same all day.",
], model_name="gpt-4o-mini")
telemetry = Telemetry.from_config()  # CTXLENS_OTLP_ENDPOINT and CTXLENS_OTLP_HEADERS
run = run_agent(
    model, [weather, station_log, read_artifact_tool(store)], [HumanMessage("What is the weather in Paris?")],
    conversation_id=conversation_id, agent_name="standalone-agent", artifact_store=store, telemetry=telemetry,
    output_levels={"station_log": "full"},
)
telemetry_ok = telemetry.flush(30_000)
telemetry.shutdown()
results = run.rounds[0].tool_results
print(json.dumps({
    "status": run.rounds[0].status,
    "answer": run.rounds[0].final_answer,
    "tools": [(r.tool_name, r.success, r.artifact_id) for r in results],
    "artifact_dir_in_agent": str(store.directory) == str(runtime_settings().artifact_dir),
    "flushed": telemetry_ok,
    "server_modules": sorted(m for m in sys.modules if m.partition(".")[0] in BLOCKED
                             or m.startswith(("pipeline.models", "pipeline.ingest", "pipeline.conf"))),
}))
'''


def run_child(conversation_id: str, env: dict[str, str]) -> dict:
    child = subprocess.run(
        [sys.executable, "-c", CHILD, conversation_id], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )
    assert child.returncode == 0, child.stderr
    return json.loads(child.stdout.strip().splitlines()[-1])


def wait_for_conversation(url: str, read_key: str, conversation_id: str, seconds: float = 30) -> dict:
    headers = {"Authorization": f"Bearer {read_key}"}
    deadline = time.monotonic() + seconds
    while True:
        listing = requests.get(f"{url}/api/conversations/?search={quote(conversation_id)}", headers=headers, timeout=10)
        assert listing.status_code == 200, listing.text
        found = [c for c in listing.json()["results"] if c["external_id"] == conversation_id]
        if found:
            detail = requests.get(f"{url}/api/conversations/{found[0]['id']}/", headers=headers, timeout=10)
            assert detail.status_code == 200, detail.text
            body = detail.json()
            if body["rounds"] and body["rounds"][0]["final_answer"] and len(body["rounds"][0]["tool_calls"]) == 3:
                return body
        if time.monotonic() > deadline:
            raise AssertionError(f"{conversation_id} did not arrive complete within {seconds} s")
        time.sleep(0.2)


@pytest.mark.django_db(transaction=True)
def test_a_standalone_agent_without_django_reports_to_a_live_ctxlens(live_uvicorn, tmp_path):
    _, ingest_key = ApiKey.generate("standalone agent", scope=Scope.INGEST)
    _, read_key = ApiKey.generate("reader", scope=Scope.READ)
    conversation_id = f"standalone-{uuid.uuid4().hex[:12]}"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "CTXLENS_")) and k != "DATABASE_URL"}
    env.update({
        "CTXLENS_OTLP_ENDPOINT": live_uvicorn.url,
        "CTXLENS_OTLP_HEADERS": f"Authorization=Bearer%20{ingest_key}",
        "CTXLENS_ARTIFACT_DIR": str(tmp_path / "agent-artifacts"),
        "PYTHONUNBUFFERED": "1",
    })

    report = run_child(conversation_id, env)

    assert report["server_modules"] == []
    assert report["status"] == "ok" and report["flushed"] and report["artifact_dir_in_agent"]
    (weather, log, read) = report["tools"]
    assert weather[:2] == ["weather", True] and weather[2] is None
    assert log[:2] == ["station_log", True] and log[2].startswith("artifact_")
    assert read[:2] == ["read_artifact", True]
    assert (tmp_path / "agent-artifacts" / log[2]).is_file()

    detail = wait_for_conversation(live_uvicorn.url, read_key, conversation_id)
    assert detail["agent_name"] == "standalone-agent"
    round_ = detail["rounds"][0]
    assert round_["user_message"] == "What is the weather in Paris?"
    assert round_["final_answer"] == "It is sunny and 21 C in Paris, and the station logged the same all day."
    calls = {c["tool_call_id"]: c for c in round_["tool_calls"]}
    assert calls["call_weather_1"]["tool_name"] == "weather" and calls["call_weather_1"]["success"]
    assert "Paris: sunny, 21 C" in calls["call_weather_1"]["observation"]
    assert log[2] in calls["call_log_1"]["observation"]
    assert str(tmp_path) not in json.dumps(detail)
