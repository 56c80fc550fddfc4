"""Long fuzz run of the OTLP decoders, the normaliser and the store (`make fuzz`).

The same properties as the short runs in tests/test_hostile_input.py, with many more examples:
the JSON and protobuf decoders decode or refuse with OtlpDecodeError (a 400), never crash; the
normaliser reads any span; store_spans stores or rejects each span and never fails its batch.
The store runs on a fresh temporary SQLite database, or on FUZZ_DATABASE_URL (a scratch
database: every example is rolled back, but do not point it at data you keep).

    .venv/bin/python bench/fuzz_otlp.py [--examples 5000] [--seed N]
    FUZZ_DATABASE_URL=postgres://postgres@127.0.0.1:5432/fuzz .venv/bin/python bench/fuzz_otlp.py

Prints examples, failures and seconds per target; exits 1 with the failing input on a failure,
which belongs in tests/test_hostile_input.py as a `test_found_*` case once fixed.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def setup_django(data_dir: str) -> None:
    os.environ["DJANGO_SETTINGS_MODULE"] = "config.settings"
    os.environ["CTXLENS_DATA_DIR"] = data_dir
    os.environ.pop("DATABASE_URL", None)
    if os.environ.get("FUZZ_DATABASE_URL"):
        os.environ["DATABASE_URL"] = os.environ["FUZZ_DATABASE_URL"]
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0, interactive=False)


def targets():
    from django.db import transaction
    from hypothesis import given
    from hypothesis import strategies as st

    from pipeline.ingest.write.store import store_spans
    from tests import otlp_fuzz
    from tests.agent_traces import record_turns

    real_export = otlp_fuzz.sample_request(record_turns("fuzz", turns=2))

    def store(records) -> None:
        with transaction.atomic():
            result = store_spans(records)
            transaction.set_rollback(True)
        assert result.accepted + result.rejected + result.duplicates == len(records)

    return {
        "otlp-json decoder": given(otlp_fuzz.json_documents)(otlp_fuzz.check_json),
        "protobuf decoder (random bytes)": given(st.binary(max_size=2000))(otlp_fuzz.check_protobuf),
        "protobuf decoder (corrupted export)": given(otlp_fuzz.byte_edits)(
            lambda edits: otlp_fuzz.check_protobuf(otlp_fuzz.mutate(real_export, edits))),
        "normaliser": given(otlp_fuzz.span_records)(lambda record: otlp_fuzz.check_records([record])),
        "store_spans": given(st.lists(otlp_fuzz.span_records, min_size=1, max_size=6))(store),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=5000, help="examples per target (the store gets a fifth)")
    parser.add_argument("--seed", type=int, help="hypothesis seed, to repeat a run")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="ctxlens-fuzz-") as data_dir:
        setup_django(data_dir)
        from hypothesis import HealthCheck, seed, settings

        failures = 0
        for name, test in targets().items():
            examples = max(1, args.examples // 5) if name == "store_spans" else args.examples
            run = settings(max_examples=examples, deadline=None, database=None, derandomize=False,
                           suppress_health_check=list(HealthCheck))(test)
            if args.seed is not None:
                run = seed(args.seed)(run)
            started = time.monotonic()
            try:
                run()
                outcome = "ok"
            except Exception:  # hypothesis has printed the falsifying example
                failures += 1
                outcome = "FAILED"
                traceback.print_exc()
            print(f"{name:38} {examples:7d} examples  {time.monotonic() - started:7.1f} s  {outcome}", flush=True)
    database = "FUZZ_DATABASE_URL" if os.environ.get("FUZZ_DATABASE_URL") else "a temporary SQLite database"
    print(f"fuzz_otlp: {failures} failing targets (store on {database})")
    env = f"FUZZ_DATABASE_URL={shlex.quote(os.environ['FUZZ_DATABASE_URL'])} " if os.environ.get("FUZZ_DATABASE_URL") else ""
    print("reproduce: " + env + shlex.join([".venv/bin/python", "bench/fuzz_otlp.py", *sys.argv[1:]]))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
