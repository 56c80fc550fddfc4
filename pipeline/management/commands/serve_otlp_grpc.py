"""Serve OTLP/gRPC trace ingest (TraceService/Export) until SIGTERM or Ctrl-C.

    manage.py serve_otlp_grpc [--port 4317] [--workers 4]
    manage.py serve_otlp_grpc --host 0.0.0.0 --tls-cert cert.pem --tls-key key.pem

API keys travel in the request metadata: on any address but a loopback one, serve TLS (or put
a TLS-terminating proxy in front). The command refuses a non-loopback host without TLS unless
--insecure says so.

The port defaults to CTXLENS_OTLP_GRPC_PORT, else 4317. Run it beside the ASGI workers; live
updates reach the dashboard through the channel layer, so with several processes set REDIS_URL.
"""

from __future__ import annotations

import ipaddress
import signal
import threading
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError, CommandParser

from pipeline.conf import ctxlens_config
from pipeline.ingest.service import load_ingest_data
from pipeline.receivers.otlp_grpc import DEFAULT_PORT, build_server

GRACE_SECONDS = 10


class Command(BaseCommand):
    help = "Serve OTLP/gRPC trace ingest (same normaliser and API keys as POST /v1/traces)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
        parser.add_argument("--port", type=int, help="default: CTXLENS_OTLP_GRPC_PORT, else 4317")
        parser.add_argument("--workers", type=int, default=4, help="request threads (default 4)")
        parser.add_argument("--tls-cert", help="PEM certificate chain: serve TLS")
        parser.add_argument("--tls-key", help="PEM private key of --tls-cert")
        parser.add_argument("--insecure", action="store_true",
                            help="serve plaintext on a non-loopback address (behind a TLS-terminating proxy)")

    def handle(self, *args: object, **options: object) -> None:
        port = options["port"] if options["port"] is not None else (ctxlens_config().otlp_grpc_port or DEFAULT_PORT)
        workers = int(options["workers"])  # type: ignore[arg-type]
        if workers < 1:
            raise CommandError("--workers must be at least 1")
        host = str(options["host"])
        tls = self._tls(options)
        if tls is None and not options["insecure"] and not _is_loopback(host):
            raise CommandError(f"--host {host} would send API keys in plaintext: give --tls-cert and --tls-key "
                               "(or --insecure behind a TLS-terminating proxy)")
        try:
            server, bound = build_server(host, int(port), workers, tls=tls)  # type: ignore[arg-type]
        except (OSError, RuntimeError) as error:
            raise CommandError(f"cannot serve OTLP/gRPC on {options['host']}:{port}: {error}") from None
        load_ingest_data()
        stop = threading.Event()
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda *_: stop.set())
        server.start()
        self.stdout.write(f"OTLP/gRPC ingest listening on {host}:{bound} ({workers} workers, "
                          f"{'TLS' if tls else 'plaintext'})")
        self.stdout.flush()
        while not stop.wait(1):
            pass
        server.stop(GRACE_SECONDS).wait()
        self.stdout.write("OTLP/gRPC ingest stopped")

    @staticmethod
    def _tls(options: dict) -> tuple[bytes, bytes] | None:
        cert, key = options.get("tls_cert"), options.get("tls_key")
        if not cert and not key:
            return None
        if not (cert and key):
            raise CommandError("--tls-cert and --tls-key go together")
        try:
            return Path(cert).read_bytes(), Path(key).read_bytes()
        except OSError as error:
            raise CommandError(f"cannot read the TLS certificate or key: {error.strerror}") from None


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
