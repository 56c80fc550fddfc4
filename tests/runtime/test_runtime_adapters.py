"""The runtime's own adapters: settings from the environment or the server, the in-memory cache,
the local artifact store."""

from __future__ import annotations

import pytest
import time_machine

from pipeline.runtime.artifacts import (
    ARTIFACT_ID_RE,
    ArtifactNotFound,
    InvalidArtifactId,
    LocalArtifactStore,
    redact_paths,
)
from pipeline.runtime.cache import Cache, InMemoryCache
from pipeline.runtime.env import EnvError
from pipeline.runtime.settings import RuntimeSettings, runtime_settings


def test_settings_from_the_environment_keep_the_agent_out_of_the_servers_sandbox(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    for name in ("CTXLENS_ARTIFACT_DIR", "CTXLENS_DATA_DIR", "CTXLENS_COMPRESSION_THRESHOLD"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("CTXLENS_TOOL_OUTPUT_LEVELS", "query_sales=BRIEF")
    settings = RuntimeSettings.from_env()
    assert settings.artifact_dir == tmp_path / "var" / "agent-artifacts"
    assert settings.compression_threshold == 0.8 and settings.tool_output_levels == {"query_sales": "brief"}
    monkeypatch.setenv("CTXLENS_MAX_TOOL_INPUT_BYTES", "lots")
    with pytest.raises(EnvError, match="CTXLENS_MAX_TOOL_INPUT_BYTES"):
        RuntimeSettings.from_env()


def test_inside_the_server_the_runtime_reads_the_servers_settings(settings, tmp_path):
    settings.CTXLENS_ARTIFACT_DIR = tmp_path
    settings.CTXLENS_COMPRESSION_THRESHOLD = 0.5
    assert (runtime_settings().artifact_dir, runtime_settings().compression_threshold) == (tmp_path, 0.5)


def test_the_in_memory_cache_has_the_cache_api_and_expires_each_key():
    cache = InMemoryCache()
    assert isinstance(cache, Cache)
    with time_machine.travel("2030-01-01 12:00:00", tick=False) as traveller:
        cache.set("a", 1, timeout=10)
        assert cache.add("a", 2) is False and cache.add("b", 5, timeout=None) is True
        assert (cache.incr("a", 4), cache.decr("b", 1)) == (5, 4)
        traveller.shift(11)
        assert cache.get("a", "gone") == "gone" and cache.get("b") == 4
        with pytest.raises(ValueError):
            cache.incr("a")
        assert cache.delete("b") and not cache.delete("b")


def test_the_in_memory_cache_stays_within_its_size():
    cache = InMemoryCache(max_entries=3)
    for n in range(5):
        cache.set(f"k{n}", n, timeout=100 + n)
    assert len(cache) == 3 and cache.get("k4") == 4 and cache.get("k0") is None


def test_the_local_store_keeps_content_by_hash_and_reads_it_back(tmp_path):
    store = LocalArtifactStore(tmp_path, ttl_hours=1)
    first = store.store(b"x" * 500, summary="xs", mime="text/plain", token_count=3)
    assert store.store(b"x" * 500) == first and ARTIFACT_ID_RE.match(first)
    content = store.read(first)
    assert (content.data, content.summary, content.size) == (b"x" * 500, "xs", 500)
    assert store.read(first, max_bytes=10).data == b"x" * 10
    assert sorted(p.name for p in tmp_path.iterdir()) == [first, f"{first}.meta.json"]
    assert not any(ARTIFACT_ID_RE.match(p.name) for p in tmp_path.iterdir() if p.name != first)


def test_the_local_store_refuses_bad_ids_expired_artifacts_and_links(tmp_path):
    now = [1_000_000.0]
    store = LocalArtifactStore(tmp_path / "sandbox", ttl_hours=1, clock=lambda: now[0])
    aid = store.store(b"report")
    with pytest.raises(InvalidArtifactId):
        store.read("../etc/passwd")
    (tmp_path / "secret").write_text("hunter2")
    (tmp_path / "sandbox" / aid).unlink()
    (tmp_path / "sandbox" / aid).symlink_to(tmp_path / "secret")
    with pytest.raises(ArtifactNotFound) as caught:
        store.read(aid)
    assert str(tmp_path) not in str(caught.value)
    now[0] += 3601
    assert not store.exists(aid) and store.remove_expired() == 1 and list((tmp_path / "sandbox").iterdir()) == []


def test_paths_are_redacted_as_given_and_resolved(tmp_path):
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "real", target_is_directory=True)
    message = f"open {link}/a failed; {tmp_path / 'real'}/b too"
    assert redact_paths(message, [link]) == "open <artifact sandbox>/a failed; <artifact sandbox>/b too"
