"""Which ASGI server should `make run` use? POST 350 KB bodies through the whole Django stack
under uvicorn and under daphne and compare requests per second.

Django's ASGI handler reads the whole body before dispatching, so POST /healthz (refused by the
CSRF middleware without touching the database) measures what the server and Django cost per
large body. Run it on a quiet machine: other load skews the comparison.

    .venv/bin/python bench/asgi_server.py [--requests 400] [--concurrency 4] [--kb 350]
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent

SERVERS = {
    "uvicorn": ["-m", "uvicorn", "config.asgi:application", "--host", "127.0.0.1", "--lifespan", "off",
                "--log-level", "warning", "--port"],
    "daphne": ["-m", "daphne", "-b", "127.0.0.1", "-p"],
}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start(name: str, data_dir: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    args = [sys.executable, *SERVERS[name], str(port)]
    if name == "daphne":
        args.append("config.asgi:application")
    env = {**os.environ, "CTXLENS_DATA_DIR": data_dir, "DEBUG": "0", "LOG_LEVEL": "WARNING"}
    proc = subprocess.Popen(args, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    for _ in range(300):
        try:
            httpx.get(f"{url}/healthz", timeout=1)
            return proc, url
        except httpx.TransportError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"{name} did not start")


def measure(url: str, body: bytes, requests: int, concurrency: int) -> tuple[float, float]:
    latencies: list[float] = []

    def worker(n: int) -> None:
        with httpx.Client(timeout=30) as client:
            for _ in range(n):
                t0 = time.perf_counter()
                reply = client.post(f"{url}/healthz", content=body, headers={"Content-Type": "application/x-protobuf"})
                latencies.append(time.perf_counter() - t0)
                assert reply.status_code in (403, 405), reply.status_code  # refused after the body is read

    per_worker = requests // concurrency
    worker(5)  # warm up
    latencies.clear()
    t0 = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(worker, [per_worker] * concurrency))
    elapsed = time.perf_counter() - t0
    return per_worker * concurrency / elapsed, statistics.median(latencies) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--kb", type=int, default=350)
    args = parser.parse_args()
    body = os.urandom(args.kb * 1024)
    results = {}
    with tempfile.TemporaryDirectory() as data_dir:
        subprocess.run([sys.executable, "manage.py", "migrate", "-v0"], cwd=ROOT,
                       env={**os.environ, "CTXLENS_DATA_DIR": data_dir}, check=True)
        for name in SERVERS:
            proc, url = start(name, data_dir)
            try:
                results[name] = measure(url, body, args.requests, args.concurrency)
            finally:
                proc.terminate()
                proc.wait()
    for name, (rps, p50) in results.items():
        print(f"{name:8s} {rps:7.1f} req/s  p50 {p50:6.1f} ms  ({args.kb} KB bodies, {args.concurrency} senders)")
    print(f"uvicorn / daphne: {results['uvicorn'][0] / results['daphne'][0]:.2f}x")
    print(f"reproduce: .venv/bin/python bench/asgi_server.py --requests {args.requests} "
          f"--concurrency {args.concurrency} --kb {args.kb}")


if __name__ == "__main__":
    main()
