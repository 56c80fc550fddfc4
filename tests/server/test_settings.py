from __future__ import annotations

import threading

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.db import close_old_connections, connection, transaction
from django.utils import timezone

from config.env import env_bool, env_float, env_int, env_list
from pipeline.checks import check_ctxlens_settings
from pipeline.conf import ctxlens_config
from pipeline.models import Conversation

sqlite_only = pytest.mark.skipif(
    connection.vendor != "sqlite", reason="the SQLite pragmas apply only to the default SQLite database"
)


@pytest.mark.parametrize(
    "reader, raw", [(env_bool, "maybe"), (env_int, "12x"), (env_float, "fast")]
)
def test_a_bad_environment_value_fails_loudly(monkeypatch, reader, raw):
    monkeypatch.setenv("CTXLENS_TEST_VALUE", raw)
    with pytest.raises(ImproperlyConfigured, match="CTXLENS_TEST_VALUE"):
        reader("CTXLENS_TEST_VALUE", 1)


def test_environment_values_parse(monkeypatch):
    monkeypatch.setenv("A_BOOL", "off")
    monkeypatch.setenv("AN_INT", "64_000")
    monkeypatch.setenv("A_LIST", "a.example, b.example,,")
    assert env_bool("A_BOOL", True) is False
    assert env_int("AN_INT", 0) == 64000
    assert env_list("A_LIST", []) == ["a.example", "b.example"]


@pytest.mark.parametrize(
    "name, value, error_id",
    [
        ("CTXLENS_COMPRESSION_THRESHOLD", 1.5, "pipeline.E006"),
        ("CTXLENS_COMPRESSION_THRESHOLD", 0, "pipeline.E006"),
        ("CTXLENS_OVERSIZED_OBSERVATION_RATIO", 0, "pipeline.E073"),
        ("CTXLENS_OVERSIZED_OBSERVATION_RATIO", 1.5, "pipeline.E073"),
        ("CTXLENS_MAX_INGEST_BYTES", 0, "pipeline.E004"),
        ("CTXLENS_ARTIFACT_THRESHOLD_BYTES", -1, "pipeline.E001"),
        ("CTXLENS_SAMPLING", "sometimes", "pipeline.E007"),
        ("CTXLENS_OTLP_COMPRESSION", "brotli", "pipeline.E008"),
        ("CTXLENS_LIVE_INTERVAL_MS", 0, "pipeline.E082"),
        ("CTXLENS_LIVE_REFRESH_MS", -1, "pipeline.E083"),
    ],
)
def test_a_system_check_reports_a_bad_setting(settings, name, value, error_id):
    setattr(settings, name, value)
    assert error_id in [e.id for e in check_ctxlens_settings()]


@pytest.mark.parametrize("path", ["no_such_module:factory", "pipeline.semconv:SPAN_KIND", "pipeline.runtime:nothing"])
def test_a_model_factory_that_names_no_callable_is_reported(settings, path):
    from pipeline.checks import check_model_factory

    settings.CTXLENS_MODEL_FACTORY = path
    [error] = check_model_factory()
    assert error.id == "pipeline.E070" and path in error.msg
    settings.CTXLENS_MODEL_FACTORY = "tests.dashboard.test_skill_timeline:factory_model"
    assert check_model_factory() == []


def test_the_default_settings_pass_the_checks():
    assert [e for e in check_ctxlens_settings() if e.level >= 40] == []


def test_overridden_settings_reach_the_cached_config(settings):
    before = ctxlens_config().compression_threshold
    settings.CTXLENS_COMPRESSION_THRESHOLD = 0.5
    assert ctxlens_config().compression_threshold == 0.5 != before


@sqlite_only
@pytest.mark.django_db
def test_sqlite_runs_in_wal_mode_with_immediate_transactions():
    with connection.cursor() as cursor:
        cursor.execute("PRAGMA journal_mode")
        assert cursor.fetchone()[0] == "wal"
    assert connection.settings_dict["OPTIONS"]["transaction_mode"] == "IMMEDIATE"


@sqlite_only
@pytest.mark.django_db(transaction=True)
def test_concurrent_writers_never_fail_with_database_locked():
    errors: list[BaseException] = []
    now = timezone.now()

    def writer(n: int) -> None:
        try:
            for i in range(25):
                with transaction.atomic():
                    # Read first, then write: the pattern that fails with DEFERRED transactions.
                    Conversation.objects.filter(external_id__startswith=f"w{n}-").count()
                    Conversation.objects.create(external_id=f"w{n}-{i}", started_at=now, last_activity_at=now)
        except BaseException as exc:  # noqa: BLE001 - collected and asserted below
            errors.append(exc)
        finally:
            close_old_connections()
            connection.close()

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert Conversation.objects.count() == 8 * 25
