"""ASGI entry point: HTTP through Django, websockets through Channels, on one port.

Serve with `uvicorn config.asgi:application` (what `make run` uses) or
`daphne config.asgi:application`.
"""

from __future__ import annotations

import gc
import os

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
django.setup(set_prefix=False)  # what django.core.asgi.get_asgi_application does, with our handler

from pipeline.receivers.asgi_handler import CycleFreeASGIHandler  # noqa: E402

django_asgi_app = CycleFreeASGIHandler()

# Imported after Django is set up: these import models.
from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402

from config.staticfiles import StaticFilesApp  # noqa: E402
from dashboard.live import record_serving_loop  # noqa: E402
from dashboard.consumers import with_server_send  # noqa: E402
from dashboard.origin import SameOriginValidator  # noqa: E402
from pipeline.receivers.otlp_router import OtlpIngestRouter  # noqa: E402
from dashboard.routing import websocket_urlpatterns  # noqa: E402
from pipeline.ingest.service import load_ingest_data  # noqa: E402

load_ingest_data()  # prices and tokenizers at startup, not in the first requests that need them

# record_serving_loop: ingest committed on other threads sends its live updates on this loop.
application = record_serving_loop(ProtocolTypeRouter(
    {
        # Static files are served by the app itself (WhiteNoise) so one process is the whole dashboard.
        "http": OtlpIngestRouter(StaticFilesApp(django_asgi_app)),
        # Scheme, host and port of the Origin must be this site's (not only the host name).
        "websocket": with_server_send(SameOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns)))),
    }
))

# What is loaded by now lives as long as the process: keep it out of the cyclic collector's
# scans, and collect the youngest generation less often (ingest allocates many short-lived
# containers per span; measured 10-15 % less CPU per span on the OTLP load).
gc.freeze()
gc.set_threshold(20_000, 10, 10)
