"""A tokenizer loads when text is first counted with it — not for a model's window or profile —
and once per process, however many threads count at the same moment (each load costs about a
second of CPU and 40–75 MB). Run in a fresh interpreter: this one's tests loaded them already."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import ROOT

SCRIPT = """
import json, threading
from pipeline.tokens import encodings
from pipeline.tokens.counting import context_window, count_tokens, model_profile

out = {"window": context_window("gpt-4o"), "profile": model_profile("claude-3-5-sonnet").encoding_name,
       "after_profiles": encodings._load.cache_info().currsize}
counts = []
threads = [threading.Thread(target=lambda: counts.append(count_tokens("hello world", "gpt-4o"))) for _ in range(8)]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
info = encodings._load.cache_info()
out.update(counts=counts, loads=info.misses, loaded=info.currsize)
print(json.dumps(out))
"""


def test_profiles_load_no_tokenizer_and_concurrent_counts_load_one_once():
    result = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, capture_output=True, text=True, check=True)
    out = json.loads(result.stdout)
    assert out == {"window": 128_000, "profile": "cl100k_base", "after_profiles": 0,
                   "counts": [2] * 8, "loads": 1, "loaded": 1}


SERVED = """
import json
from pipeline.tokens import encodings
before = encodings._load.cache_info().currsize
import config.asgi
after = encodings._load.cache_info()
from pipeline.tokens.counting import count_tokens
counted = [count_tokens("hello world", "gpt-4o"), count_tokens("hello world", "claude-3-5-sonnet")]
print(json.dumps({"before": before, "loaded": after.currsize, "loads_after_counting": encodings._load.cache_info().misses - after.misses}))
"""


def test_the_served_application_loads_every_builtin_tokenizer_at_startup():
    """The server counts tool results in its first requests: the tokenizers load with the app
    (config/asgi.py), so no request waits for them."""
    result = subprocess.run([sys.executable, "-c", SERVED], cwd=ROOT, capture_output=True, text=True, check=True)
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out == {"before": 0, "loaded": 2, "loads_after_counting": 0}
