from __future__ import annotations

import re

import pytest
from django.contrib.auth import authenticate, get_user_model
from django.core.management import call_command
from django.test import RequestFactory

pytestmark = pytest.mark.django_db


def logs_in(username: str, password: str) -> object:
    """authenticate() as the login page calls it: with the request (login throttling needs its
    client address, and refuses to guess without one)."""
    return authenticate(RequestFactory().post("/login/"), username=username, password=password)


def run_bootstrap(capsys, *args: str) -> str:
    call_command("bootstrap", "--no-demo", *args)
    return capsys.readouterr().out


def test_first_run_creates_a_superuser_and_prints_a_working_password(capsys, monkeypatch):
    monkeypatch.delenv("CTXLENS_ADMIN_PASSWORD", raising=False)
    out = run_bootstrap(capsys)
    password = re.search(r"with password: (\S+)", out).group(1)
    user = logs_in("admin", password)
    assert user is not None and user.is_superuser
    assert "http://127.0.0.1:8000/" in out


def test_later_runs_do_not_create_or_print_a_password(capsys, monkeypatch):
    monkeypatch.delenv("CTXLENS_ADMIN_PASSWORD", raising=False)
    first = re.search(r"with password: (\S+)", run_bootstrap(capsys)).group(1)
    second = run_bootstrap(capsys)
    assert first not in second and "with password:" not in second
    assert get_user_model().objects.filter(is_superuser=True).count() == 1


def test_the_password_can_come_from_the_environment(capsys, monkeypatch):
    monkeypatch.setenv("CTXLENS_ADMIN_PASSWORD", "a-chosen-passphrase-42")
    out = run_bootstrap(capsys, "--url", "http://127.0.0.1:9000")
    assert "a-chosen-passphrase-42" not in out
    assert "http://127.0.0.1:9000/" in out
    assert logs_in("admin", "a-chosen-passphrase-42") is not None


def test_the_login_page_is_served(client):
    response = client.get("/login/")
    assert response.status_code == 200
    assert b"Log in to ctxlens" in response.content


def test_an_anonymous_visitor_is_sent_to_the_login_page(client):
    response = client.get("/")
    assert response.status_code == 302 and response["Location"].startswith("/login/")
