"""How long a one-span OTLP export waits behind one huge request (issue #10, defect 7).

Two cases, each against a fresh uvicorn served the way `make run` serves it, for this checkout
and for a base commit (default: the last commit before the fix) back to back in one run:
- **prompt**: a span whose user message is BIG_PROMPT_MB of text without token counts (the
  server tokenises it after its reply), then at once a one-span export: how long that waits;
- **batch**: one request of BATCH_SPANS spans, and half a second later a one-span export: how
  long that waits, and how long the big one took.

    .venv/bin/python bench/ingest_fairness.py [--base b6b8a00] [--prompt-mb 20] [--batch-spans 50000]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
from asgi_server import free_port  # noqa: E402
from trees import checkout  # noqa: E402

PROTOBUF = "application/x-protobuf"


def spans_body(trace_byte: int, spans: int) -> bytes:
    request = ExportTraceServiceRequest()
    scope = request.resource_spans.add().scope_spans.add()
    now = time.time_ns()
    for i in range(spans):
        span = scope.spans.add()
        span.trace_id = bytes([trace_byte]) + (i // 20).to_bytes(15, "big")
        span.span_id = (i + 1).to_bytes(8, "big")
        span.name = "step"
        span.start_time_unix_nano, span.end_time_unix_nano = now + i, now + i + 1000
        span.attributes.append(KeyValue(key="step.text", value=AnyValue(string_value=f"step {i} " * 10)))
    return request.SerializeToString()


def prompt_body(megabytes: int) -> bytes:
    text = " ".join(f"row {i}: revenue {i * 37 % 1000} EUR, region {i % 7};" for i in range(megabytes * 24_000))
    now = time.time_ns()
    attributes = {"gen_ai.operation.name": "chat", "gen_ai.request.model": "gpt-4o",
                  "gen_ai.input.messages": json.dumps([{"role": "user", "parts": [{"type": "text", "content": text}]}])}
    span = {"traceId": "ee" * 16, "spanId": "ee" * 8, "name": "chat gpt-4o", "startTimeUnixNano": str(now),
            "endTimeUnixNano": str(now + 1000), "attributes": [
                {"key": k, "value": {"stringValue": v}} for k, v in attributes.items()]}
    return json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [span]}]}]}).encode()


class Server:
    """A migrated throw-away database and a uvicorn on it, for the code in `tree`."""

    def __init__(self, tree: Path) -> None:
        self.data = tempfile.mkdtemp(prefix="ctxlens-fairness-")
        env = {**os.environ, "CTXLENS_DATA_DIR": self.data, "DEBUG": "0", "LOG_LEVEL": "WARNING"}
        env.pop("DATABASE_URL", None)
        env.pop("REDIS_URL", None)
        run = lambda *args: subprocess.run([sys.executable, "manage.py", *args], cwd=tree, env=env,  # noqa: E731
                                           check=True, capture_output=True, text=True).stdout
        run("migrate", "--no-input")
        self.key = run("create_api_key", "bench", "--scope", "ingest").strip().splitlines()[-1].split()[-1]
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.process = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "config.asgi:application", "--host", "127.0.0.1", "--port", str(port),
             "--lifespan", "off", "--log-level", "warning"], cwd=tree, env=env,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(300):
            try:
                httpx.get(f"{self.url}/healthz", timeout=1)
                break
            except httpx.TransportError:
                time.sleep(0.1)

    def post(self, body: bytes, content_type: str = PROTOBUF) -> tuple[int, float]:
        began = time.perf_counter()
        reply = httpx.post(f"{self.url}/v1/traces", content=body, timeout=600,
                           headers={"Authorization": f"Bearer {self.key}", "Content-Type": content_type})
        return reply.status_code, time.perf_counter() - began

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(10)


def measure(tree: Path, prompt: bytes, batch: bytes) -> dict[str, float]:
    server = Server(tree)
    try:
        server.post(spans_body(9, 1))  # warm up
        status, _ = server.post(prompt, "application/json")
        assert status == 200, status
        _, after_prompt = server.post(spans_body(10, 1))
        big: dict[str, float] = {}
        sender = threading.Thread(target=lambda: big.update(seconds=server.post(batch)[1]))
        sender.start()
        time.sleep(0.5)
        _, during_batch = server.post(spans_body(11, 1))
        sender.join()
        return {"after_prompt": after_prompt, "during_batch": during_batch, "batch": big["seconds"]}
    finally:
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default="b6b8a00", help="the commit to compare with (default: before the fix)")
    parser.add_argument("--prompt-mb", type=int, default=20)
    parser.add_argument("--batch-spans", type=int, default=50_000)
    args = parser.parse_args()
    prompt, batch = prompt_body(args.prompt_mb), spans_body(1, args.batch_spans)
    with checkout(args.base) as base:
        results = {f"base {args.base}": measure(base, prompt, batch), "this checkout": measure(ROOT, prompt, batch)}
    print(f"one-span export after a {args.prompt_mb} MB prompt without counts / while a {args.batch_spans}-span "
          "request is stored (seconds until its reply):")
    for name, r in results.items():
        print(f"  {name:>16}: after prompt {r['after_prompt']:.3f} s, during batch {r['during_batch']:.3f} s "
              f"(the batch itself {r['batch']:.1f} s)")
    old, new = results[f"base {args.base}"], results["this checkout"]
    print(f"  ratio base/this: after prompt {old['after_prompt'] / new['after_prompt']:.1f}x, "
          f"during batch {old['during_batch'] / new['during_batch']:.1f}x")
    print(f"reproduce: .venv/bin/python bench/ingest_fairness.py --base {args.base} --prompt-mb {args.prompt_mb} "
          f"--batch-spans {args.batch_spans}")


if __name__ == "__main__":
    main()
