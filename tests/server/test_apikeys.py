from __future__ import annotations

import hashlib

import pytest
from django.core.management import call_command

from pipeline.models import ApiKey
from pipeline.models.apikeys import Scope

pytestmark = pytest.mark.django_db


def test_only_the_hash_of_a_key_is_stored():
    key, raw = ApiKey.generate("agent", Scope.INGEST)
    stored = ApiKey.objects.get(pk=key.pk)
    assert stored.key_hash == hashlib.sha256(raw.encode()).hexdigest()
    assert raw not in {stored.key_hash, stored.prefix, stored.name}
    assert raw.startswith(stored.prefix)


def test_a_key_authenticates_until_it_is_revoked():
    key, raw = ApiKey.generate("agent", Scope.INGEST)
    assert ApiKey.authenticate(raw) == key
    key.revoke()
    assert ApiKey.authenticate(raw) is None


def test_an_authenticated_key_is_read_whole_in_one_statement(django_assert_num_queries, django_user_model):
    key, raw = ApiKey.generate("agent", Scope.ALL, created_by=django_user_model.objects.create_user("carol"))
    ApiKey.objects.filter(pk=key.pk).update(last_used_at=key.created_at)
    with django_assert_num_queries(1):
        found = ApiKey.authenticate(raw)
        loaded = {field.attname: getattr(found, field.attname) for field in ApiKey._meta.concrete_fields}
    assert loaded == {field.attname: getattr(ApiKey.objects.get(pk=key.pk), field.attname)
                      for field in ApiKey._meta.concrete_fields}
    assert found.last_used_at == key.created_at and found.created_by_id == key.created_by_id
    assert found.allows(Scope.READ)


def test_a_wrong_key_does_not_authenticate():
    _, raw = ApiKey.generate("agent")
    assert ApiKey.authenticate(raw[:-1] + ("x" if raw[-1] != "x" else "y")) is None
    assert ApiKey.authenticate("") is None
    assert ApiKey.authenticate("Bearer " + raw) is None


@pytest.mark.parametrize(
    "scope, ingest, read",
    [(Scope.INGEST, True, False), (Scope.READ, False, True), (Scope.ALL, True, True)],
)
def test_a_key_allows_only_its_scope(scope, ingest, read):
    key, _ = ApiKey.generate("agent", scope)
    assert key.allows(Scope.INGEST) is ingest
    assert key.allows(Scope.READ) is read


def test_a_revoked_key_allows_nothing():
    key, _ = ApiKey.generate("agent", Scope.ALL)
    key.revoke()
    assert not key.allows(Scope.INGEST) and not key.allows(Scope.READ)


def test_create_api_key_prints_the_key_alone_on_its_last_line(capsys):
    call_command("create_api_key", "ci-agent", "--scope", "read")
    last_line = capsys.readouterr().out.strip().splitlines()[-1]
    key = ApiKey.authenticate(last_line)
    assert key is not None and key.name == "ci-agent" and key.scope == Scope.READ
