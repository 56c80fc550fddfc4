"""`manage.py demo_agent`: run the demo conversations through the real pipeline and record them.

The agent runs with the server's adapters (its cache, its artifact store). Spans go in-process
to ctxlens's store by default; `--otlp-endpoint URL [--header K=V ...]`
also sends them over OTLP/HTTP (to this or any other ctxlens, or any OTLP backend), and
`--no-store` sends them only there.
"""

from __future__ import annotations

import logging
import time

from django.core.management.base import BaseCommand, CommandError, CommandParser

from pipeline.adapters import in_process_telemetry, tool_adapters
from pipeline.insight import finding_counts
from pipeline.runtime.demo.scenario import run_demo
from pipeline.runtime.telemetry.config import ObservabilityConfig, parse_header_options
from pipeline.runtime.telemetry.spans import Telemetry


class Command(BaseCommand):
    help = "Run the demo agent (scripted model, business-analysis tools) and record its spans."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--otlp-endpoint", default="", help="Also export spans over OTLP/HTTP to this URL.")
        parser.add_argument(
            "--header", action="append", default=[], metavar="KEY=VALUE",
            help="A header for the OTLP endpoint, e.g. 'Authorization=Bearer ctx_...', value percent-decoded "
                 "(a literal %% is %%25); repeatable.",
        )
        parser.add_argument("--no-store", action="store_true", help="Do not write spans to this ctxlens's database.")
        parser.add_argument("--seed", type=int, default=7, help="Seed of the made-up sales data.")

    def handle(self, *args, otlp_endpoint: str, header: list[str], no_store: bool, seed: int, **options) -> None:
        if no_store and not otlp_endpoint:
            raise CommandError("--no-store needs --otlp-endpoint, or the spans go nowhere")
        try:
            headers = parse_header_options(header)
        except ValueError as exc:
            raise CommandError(f"--header: {exc}") from None
        config = ObservabilityConfig.from_settings(
            sampling="always",  # a demo that samples itself away shows nothing
            otlp_endpoint=otlp_endpoint,
            otlp_headers=headers or ObservabilityConfig.from_settings().otlp_headers,
        )
        telemetry = Telemetry.from_config(config) if no_store else in_process_telemetry(config)
        started = time.monotonic()
        tool_logger = logging.getLogger("pipeline.runtime.executor")
        level = tool_logger.level
        tool_logger.setLevel(logging.WARNING)  # the demo's retries are on purpose
        try:
            report = run_demo(
                telemetry, seed=seed, **tool_adapters(),
                on_round=lambda title, r: self.stdout.write(
                    f"  {title}: round {r.index + 1} {r.status}, {r.llm_calls} model calls, "
                    f"{len(r.tool_results)} tool calls"
                ),
            )
        finally:
            tool_logger.setLevel(level)
            telemetry.shutdown()  # flushes every destination
        if not no_store:
            # The demo's finding counts now, in this thread: a background refresh would still be
            # running when the command exits.
            finding_counts.stop()
            finding_counts.refresh_stale()
        where = " and ".join(filter(None, ["the store" if not no_store else "", "OTLP" if otlp_endpoint else ""]))
        self.stdout.write(self.style.SUCCESS(
            f"Demo: {report.line()} in {time.monotonic() - started:.1f} s; spans sent to {where}."
        ))
