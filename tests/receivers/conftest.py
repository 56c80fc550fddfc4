"""Fixtures the receiver tests share."""

from __future__ import annotations

import pytest

from tests.otlp_servers import start_grpc


@pytest.fixture
def grpc_servers(transactional_db, tmp_path):
    started = []

    def start(**env: str):
        server = start_grpc(tmp_path, extra_env=env)
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()
