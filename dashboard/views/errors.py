"""The 400 Django answers itself (`handler400`), such as for a Host this server does not serve.
It says what was wrong, as every other refusal does: in the API's JSON under /api/, in plain text
elsewhere, never Django's HTML page. (Exception texts are not echoed: some name files.)"""

from __future__ import annotations

from django.core.exceptions import DisallowedHost
from django.http import HttpRequest, HttpResponse

from pipeline.receivers.asgi_handler import WRONG_HOST
from pipeline.receivers.asgi_handler import bad_request as bad_request_response


def bad_request(request: HttpRequest, exception: Exception) -> HttpResponse:
    message = WRONG_HOST if isinstance(exception, DisallowedHost) else "the request cannot be served as sent"
    return bad_request_response(request.path_info, message)
