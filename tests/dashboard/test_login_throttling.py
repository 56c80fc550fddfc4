"""Login throttling: failed log-ins counted per user name and per client address in the database,
a clear message on the login page at the limit, and other users and addresses unaffected."""

from __future__ import annotations

from datetime import timedelta

import pytest
import time_machine
from django.conf import settings

pytestmark = pytest.mark.django_db

LIMIT = settings.CTXLENS_LOGIN_FAILURE_LIMIT
LOCKED_MESSAGE = "Too many failed log-ins"


def log_in(client, username: str, password: str, address: str = "10.0.0.1"):
    return client.post("/login/", {"username": username, "password": password}, REMOTE_ADDR=address)


def test_the_defaults_are_sane():
    assert 3 <= LIMIT <= 10
    assert 5 <= settings.CTXLENS_LOGIN_LOCKOUT_MINUTES <= 60


def test_a_user_name_is_locked_after_the_limit_from_any_address(client, alice, bob):
    for n in range(LIMIT - 1):
        reply = log_in(client, "alice", "wrong", address=f"10.0.1.{n}")
        assert reply.status_code == 200 and LOCKED_MESSAGE not in reply.content.decode()
    # The failure that reaches the limit already says so.
    assert LOCKED_MESSAGE in log_in(client, "alice", "wrong", address="10.0.1.99").content.decode()
    # Even the right password, from yet another address, is refused while the lock lasts.
    locked = log_in(client, "alice", "alice-pass-123", address="10.0.2.1")
    assert locked.status_code == 429
    page = locked.content.decode()
    assert LOCKED_MESSAGE in page and f"{settings.CTXLENS_LOGIN_LOCKOUT_MINUTES} minutes" in page
    assert 'id="id_username"' in page  # still the login page
    assert "_auth_user_id" not in client.session
    # Another user from another address is not blocked.
    assert log_in(client, "bob", "bob-pass-123", address="10.0.3.1").status_code == 302


def test_an_address_is_locked_after_the_limit_for_any_user_name(client, bob):
    for n in range(LIMIT):
        log_in(client, f"guess-{n}", "wrong", address="10.0.9.9")
    assert log_in(client, "bob", "bob-pass-123", address="10.0.9.9").status_code == 429
    assert log_in(client, "bob", "bob-pass-123", address="10.0.9.10").status_code == 302


def test_the_lock_ends_with_the_window(client, alice):
    with time_machine.travel("2030-01-01 12:00", tick=False) as clock:
        for _ in range(LIMIT):
            log_in(client, "alice", "wrong")
        assert log_in(client, "alice", "alice-pass-123").status_code == 429
        clock.shift(timedelta(minutes=settings.CTXLENS_LOGIN_LOCKOUT_MINUTES, seconds=1))
        assert log_in(client, "alice", "alice-pass-123").status_code == 302


def test_failures_below_the_limit_do_not_block_and_a_success_resets_them(client, alice):
    for _ in range(LIMIT - 1):
        log_in(client, "alice", "wrong")
    assert log_in(client, "alice", "alice-pass-123").status_code == 302
    client.logout()
    for _ in range(LIMIT - 1):
        log_in(client, "alice", "wrong")
    assert log_in(client, "alice", "alice-pass-123").status_code == 302


def test_the_admin_login_is_throttled_too(client, alice):
    for _ in range(LIMIT):
        client.post("/admin/login/", {"username": "alice", "password": "wrong"}, REMOTE_ADDR="10.0.5.5")
    reply = client.post("/admin/login/", {"username": "alice", "password": "alice-pass-123"}, REMOTE_ADDR="10.0.5.6")
    assert reply.status_code == 429 and LOCKED_MESSAGE in reply.content.decode()


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.mark.anyio
@pytest.mark.django_db(transaction=True)
async def test_the_asgi_path_shows_the_message_too(async_client, alice):
    for n in range(LIMIT):
        await async_client.post("/login/", {"username": "alice", "password": "wrong"}, REMOTE_ADDR=f"10.0.6.{n}")
    reply = await async_client.post("/login/", {"username": "alice", "password": "alice-pass-123"},
                                    REMOTE_ADDR="10.0.7.1")
    assert reply.status_code == 429 and LOCKED_MESSAGE in reply.content.decode()
    assert "Content-Security-Policy" in reply.headers
