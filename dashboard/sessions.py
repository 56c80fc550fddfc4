"""The session store (SESSION_ENGINE): Django's database store, with the key checked first.

Django looks up any `sessionid` cookie of eight characters or more. PostgreSQL refuses a text
parameter that holds NUL, so a forged cookie turned into a 500 before authentication ran, on
every page, API call and websocket. A key Django cannot have made (its keys are lowercase
letters and digits, at most 40 of them) is no session: the request is anonymous, as with an
unknown key.
"""

from __future__ import annotations

from django.contrib.sessions.backends.base import VALID_KEY_CHARS
from django.contrib.sessions.backends.db import SessionStore as DatabaseSessionStore

_KEY_CHARS = frozenset(VALID_KEY_CHARS)
_KEY_MAX = 40  # django_session.session_key's length


class SessionStore(DatabaseSessionStore):
    def _validate_session_key(self, key: str | None) -> bool:
        return bool(key) and 8 <= len(key) <= _KEY_MAX and _KEY_CHARS.issuperset(key)
