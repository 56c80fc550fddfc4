"""Login on every route and CSRF on every form, found by walking the URL configuration, so a
page, fragment or API endpoint added later is checked without anyone listing it here."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver, reverse

from tests.dashboard_fixtures import make_conversation

pytestmark = pytest.mark.django_db

# Routes that answer anonymous requests on purpose, and why.
PUBLIC = {
    "login",  # the way in
    "logout",  # POST only, and harmless when logged out
    "healthz",  # for load balancers; says nothing about the data
    "otlp-traces", "otlp-logs", "otlp-metrics",  # API-key authenticated ingest (tests/receivers/test_otlp_errors.py)
    "api:not-found",  # a JSON 404 for any unknown /api/ path
}
PLACEHOLDERS = {"pk": "1", "artifact_id": "artifact_" + "0" * 32}


def routes(patterns: list, namespace: str | None = None) -> Iterator[tuple[str, URLPattern]]:
    for pattern in patterns:
        if isinstance(pattern, URLResolver):
            if pattern.app_name == "admin":
                continue  # Django's admin guards itself (staff only; tests/test_admin.py)
            yield from routes(pattern.url_patterns, pattern.namespace or namespace)
        elif pattern.name:
            yield (f"{namespace}:{pattern.name}" if namespace else pattern.name), pattern


def guarded_routes() -> dict[str, list[str]]:
    """Route name -> the names of its arguments, for every route that needs a login or a key."""
    return {name: list(pattern.pattern.regex.groupindex) for name, pattern in routes(get_resolver().url_patterns)
            if name not in PUBLIC}


def url_of(name: str, values: dict[str, str]) -> str:
    return reverse(name, kwargs={arg: values[arg] for arg in guarded_routes()[name]})


def guarded_urls() -> list[str]:
    return [url_of(name, PLACEHOLDERS) for name in guarded_routes()]


def object_ids(demo) -> dict[str, dict[str, str]]:
    """The arguments that name stored objects of `demo`, by route (a new route must be added here)."""
    conversation = {"pk": str(demo.conversation.pk)}
    compression = {"pk": str(demo.compression.pk)}
    artifact = {"artifact_id": demo.artifact.artifact_id}
    return {
        "conversation": conversation, "conversation-fragments": conversation, "api:conversation-detail": conversation,
        "llm-call": {"pk": str(demo.llm_calls[0].pk)}, "api:llm-call-detail": {"pk": str(demo.llm_calls[0].pk)},
        "api:conversation-findings": conversation, "api:round-spans": {"pk": str(demo.rounds[0].pk)},
        "compression": compression, "api:compression-detail": compression,
        "artifact": artifact, "api:artifact-detail": artifact, "api:artifact-content": artifact,
    }


def test_the_walk_finds_the_pages_the_fragments_and_the_api():
    urls = guarded_urls()
    assert {"/", "/conversations/", "/conversations/1/", "/fragments/overview/", "/api/conversations/",
            "/api/tools/stats/", "/api/schema/", "/api/ingest/"} <= set(urls)
    assert len(urls) >= 25


@pytest.mark.parametrize("url", guarded_urls())
def test_an_anonymous_request_is_sent_to_log_in_or_refused(client, url):
    make_conversation(rounds=1)
    response = client.get(url)
    if url.startswith(("/api/", "/fragments/")):
        assert response.status_code == 401, url
        assert response["Content-Type"].startswith("application/json")
    else:
        assert response.status_code == 302, url
        assert response["Location"] == f"{reverse('login')}?next={url}"


@pytest.mark.parametrize("name", guarded_routes())
def test_a_signed_in_user_is_let_in(client, bob, artifact_dir, name):
    """bob is an ordinary user, not staff: every page is for any signed-in user."""
    demo = make_conversation(rounds=1, artifact_dir=artifact_dir)
    client.force_login(bob)
    url = url_of(name, object_ids(demo).get(name, {}))
    response = client.get(url)
    if name == "api:ingest":  # ingest takes an API key with the ingest scope, never a session
        assert response.status_code == 401
    else:
        assert response.status_code == 200, url


@pytest.mark.parametrize("cookie", ["abcdefgh\x00ijklmnop", "x" * 5000, "é" * 32, "ABCDEFGHIJKLMNOPQRSTUVWXYZ012345"])
def test_a_forged_session_cookie_is_no_session(client, bob, cookie):
    """PostgreSQL refuses NUL in a query: such a cookie once made every request a 500."""
    client.force_login(bob)
    signed_in = client.cookies["sessionid"].value
    client.cookies["sessionid"] = cookie
    assert client.get("/api/compressions/").status_code == 401
    assert client.get("/").status_code == 302
    client.cookies["sessionid"] = signed_in
    assert client.get("/api/compressions/").status_code == 200


def forms(html: str) -> list[str]:
    return re.findall(r"<form\b[^>]*>.*?</form>", html, re.S | re.I)


def test_every_post_form_carries_a_csrf_token(client, alice, artifact_dir):
    demo = make_conversation(rounds=2, artifact_dir=artifact_dir)
    client.force_login(alice)
    pages = [reverse(n) for n in ("overview", "conversations", "compressions", "tools", "tool-calls", "artifacts")]
    pages += [reverse("conversation", args=[demo.conversation.pk]), reverse("llm-call", args=[demo.llm_calls[0].pk]),
              reverse("compression", args=[demo.compression.pk]), reverse("artifact", args=[demo.artifact.artifact_id])]
    posts = 0
    for url in pages:
        for form in forms(client.get(url).content.decode()):
            if re.search(r'method="post"', form, re.I):
                posts += 1
                assert 'name="csrfmiddlewaretoken"' in form, url
    assert posts == len(pages)  # the log-out form in the top bar of each page
    client.logout()
    assert 'name="csrfmiddlewaretoken"' in forms(client.get(reverse("login")).content.decode())[0]


def test_logging_in_and_out_needs_the_csrf_token(alice):
    browser = Client(enforce_csrf_checks=True)
    credentials = {"username": "alice", "password": "alice-pass-123"}
    assert browser.post(reverse("login"), credentials).status_code == 403
    token = browser.get(reverse("login")).cookies["csrftoken"].value
    assert browser.post(reverse("login"), {**credentials, "csrfmiddlewaretoken": token}).status_code == 302
    assert browser.get(reverse("overview")).status_code == 200
    # Another site cannot log the user out with a bare POST.
    assert browser.post(reverse("logout")).status_code == 403
    assert browser.get(reverse("overview")).status_code == 200
    token = browser.cookies["csrftoken"].value
    assert browser.post(reverse("logout"), {"csrfmiddlewaretoken": token}).status_code == 302
    assert browser.get(reverse("overview")).status_code == 302


def test_a_browser_session_cannot_ingest_through_the_rest_api(alice):
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(alice)
    token = browser.get(reverse("overview")).cookies.get("csrftoken")
    headers = {"X-CSRFToken": token.value} if token else {}
    response = browser.post("/api/ingest/", {"schema_version": "1.0", "events": []}, content_type="application/json",
                            headers=headers)
    assert response.status_code in {401, 403}
