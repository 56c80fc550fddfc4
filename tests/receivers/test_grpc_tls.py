"""OTLP/gRPC over TLS (`serve_otlp_grpc --tls-cert --tls-key`), and no plaintext keys off loopback."""

from __future__ import annotations

import subprocess
from pathlib import Path

import grpc
import pytest
from django.core.management import CommandError, call_command
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace.export import SpanExportResult

from pipeline.models import ApiKey, Span
from tests.agent_traces import record_turns, span_count
from tests.otlp_servers import start_grpc
from tests.receivers.test_grpc_ingest import one_span_request, raw_export

pytestmark = pytest.mark.django_db(transaction=True)


def self_signed(tmp_path: Path) -> tuple[Path, Path]:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost",
         "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )
    return cert, key


def test_the_otel_grpc_exporter_stores_a_turn_over_tls_and_plaintext_is_refused(tmp_path):
    cert, key = self_signed(tmp_path)
    server = start_grpc(tmp_path, args=("--tls-cert", str(cert), "--tls-key", str(key)))
    try:
        ingest_key = ApiKey.generate("tls agent", scope="ingest")[1]
        client = OTLPSpanExporter(endpoint=f"https://localhost:{server.port}",
                                  headers={"authorization": f"Bearer {ingest_key}"},
                                  credentials=grpc.ssl_channel_credentials(cert.read_bytes()), timeout=10)
        assert client.export(record_turns("over-tls")) == SpanExportResult.SUCCESS
        assert Span.objects.count() == span_count()
        with pytest.raises(grpc.RpcError) as plaintext:  # a plaintext client cannot talk to it
            raw_export(server, one_span_request(), ingest_key)
        assert plaintext.value.code() == grpc.StatusCode.UNAVAILABLE
        assert Span.objects.count() == span_count()
    finally:
        server.stop()


@pytest.mark.parametrize("host", ["0.0.0.0", "192.0.2.7", "::"])
def test_it_refuses_to_send_keys_in_plaintext_off_loopback(host):
    with pytest.raises(CommandError, match="plaintext"):
        call_command("serve_otlp_grpc", "--host", host, "--port", "0")


def test_a_certificate_without_its_key_is_refused(tmp_path):
    cert, _ = self_signed(tmp_path)
    with pytest.raises(CommandError, match="go together"):
        call_command("serve_otlp_grpc", "--tls-cert", str(cert), "--port", "0")
