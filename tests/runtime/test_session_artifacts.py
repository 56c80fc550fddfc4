"""At the end of an agent session the runtime removes the artifacts that session stored, when
configured to (Agent.close / run_agent; CTXLENS_ARTIFACT_CLEANUP_ON_SESSION_END)."""

from __future__ import annotations

import pytest
from langchain_core.messages import HumanMessage
from langchain_core.tools import tool
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from pipeline import semconv as sc
from pipeline.artifacts.store import ServerArtifactStore
from pipeline.models import Artifact
from pipeline.runtime.agent import Agent, run_agent
from pipeline.runtime.artifacts import LocalArtifactStore
from pipeline.runtime.demo.fake_model import ScriptedChatModel, calls, tool_call
from pipeline.runtime.settings import RuntimeSettings, use_settings_source
from pipeline.runtime.telemetry.config import ObservabilityConfig
from pipeline.runtime.telemetry.spans import Telemetry


@tool
def export_rows(n: int) -> list[dict]:
    """Export n rows."""
    return [{"id": i, "region": f"region {i}", "revenue": i * 1000} for i in range(n)]


def model() -> ScriptedChatModel:
    return ScriptedChatModel.from_script([calls(tool_call("export_rows", {"n": 50})), "Exported 50 rows."])


def artifact_ids_on_spans(spans: InMemorySpanExporter) -> set[str]:
    return {s.attributes[sc.TOOL_ARTIFACT_ID] for s in spans.get_finished_spans() if sc.TOOL_ARTIFACT_ID in s.attributes}


def run_session(store, *, telemetry: Telemetry | None = None, **options) -> None:
    run_agent(model(), [export_rows], [HumanMessage("Export the Q3 rows")], artifact_store=store,
              output_levels={"export_rows": "full"}, telemetry=telemetry, **options)


def test_a_session_that_ends_removes_its_artifacts(tmp_path):
    spans = InMemorySpanExporter()
    telemetry = Telemetry.from_config(ObservabilityConfig(), exporters=[spans], batch=False)
    store = LocalArtifactStore(tmp_path)
    with Agent(model(), [export_rows], artifact_store=store, output_levels={"export_rows": "full"},
               telemetry=telemetry, cleanup_artifacts=True) as agent:
        agent.turn("Export the Q3 rows")
        (stored,) = artifact_ids_on_spans(spans)  # what the tool span told the dashboard
        assert store.exists(stored) and agent.artifact_ids() == {stored}
    assert not store.exists(stored) and list(tmp_path.iterdir()) == []  # file and sidecar gone


def test_by_default_the_artifacts_outlive_the_session(tmp_path):
    store = LocalArtifactStore(tmp_path)
    run_session(store)
    assert len([p for p in tmp_path.iterdir() if not p.name.endswith(".meta.json")]) == 1


def test_the_environment_turns_it_on(tmp_path, monkeypatch):
    monkeypatch.setenv("CTXLENS_ARTIFACT_CLEANUP_ON_SESSION_END", "1")
    previous = use_settings_source(RuntimeSettings.from_env)  # an agent process without a server
    try:
        store = LocalArtifactStore(tmp_path)
        run_session(store)
    finally:
        use_settings_source(previous)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.django_db
def test_a_server_store_keeps_artifacts_its_tool_calls_refer_to(artifact_dir):
    """The server's invariant wins: its artifacts go with their conversations (prune) or by TTL."""
    run_session(ServerArtifactStore(), cleanup_artifacts=True)
    (row,) = Artifact.objects.all()
    assert row.file_path.is_file()
