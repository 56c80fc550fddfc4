"""Serve OTLP/gRPC trace ingest (TraceService/Export) until SIGTERM or Ctrl-C.

    manage.py serve_otlp_grpc [--host 0.0.0.0] [--port 4317] [--workers 4]

The port defaults to CTXLENS_OTLP_GRPC_PORT, else 4317. Run it beside the ASGI workers; live
updates reach the dashboard through the channel layer, so with several processes set REDIS_URL.
"""

from __future__ import annotations

import signal
import threading

from django.core.management.base import BaseCommand, CommandError, CommandParser

from pipeline.conf import ctxlens_config
from pipeline.grpc_server import DEFAULT_PORT, build_server

GRACE_SECONDS = 10


class Command(BaseCommand):
    help = "Serve OTLP/gRPC trace ingest (same normaliser and API keys as POST /v1/traces)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
        parser.add_argument("--port", type=int, help="default: CTXLENS_OTLP_GRPC_PORT, else 4317")
        parser.add_argument("--workers", type=int, default=4, help="request threads (default 4)")

    def handle(self, *args: object, **options: object) -> None:
        port = options["port"] if options["port"] is not None else (ctxlens_config().otlp_grpc_port or DEFAULT_PORT)
        workers = int(options["workers"])  # type: ignore[arg-type]
        if workers < 1:
            raise CommandError("--workers must be at least 1")
        try:
            server, bound = build_server(str(options["host"]), int(port), workers)  # type: ignore[arg-type]
        except (OSError, RuntimeError) as error:
            raise CommandError(f"cannot serve OTLP/gRPC on {options['host']}:{port}: {error}") from None
        stop = threading.Event()
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda *_: stop.set())
        server.start()
        self.stdout.write(f"OTLP/gRPC ingest listening on {options['host']}:{bound} ({workers} workers)")
        self.stdout.flush()
        while not stop.wait(1):
            pass
        server.stop(GRACE_SECONDS).wait()
        self.stdout.write("OTLP/gRPC ingest stopped")
