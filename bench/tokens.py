"""count_tokens throughput against raw tiktoken on the same ~10 MB of mixed text, for both
encodings: cl100k_base (a Claude model: cl100k × 1.15) and o200k_base (gpt-4o, exact).

Run from the repository root:  .venv/bin/python bench/tokens.py [--mb 10] [--repeat 5]

The text is generated deterministically (English prose, Chinese prose, JSON tool output, in
2–4 KB messages). Both sides count the whole text as messages (one call per message) and as
one string; each figure is the best of --repeat runs, with the sides interleaved so that
other load on the machine hits them alike. The ratio printed is count_tokens' time over raw
tiktoken's (1.00 = no overhead; the target is at most 1.10).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

import django  # noqa: E402

django.setup()

from pipeline.tokens.counting import count_tokens, model_profile  # noqa: E402
from pipeline.tokens.encodings import tiktoken_encoding  # noqa: E402
WORDS = (
    "the agent tool call result context window token budget observation summary retry timeout "
    "artifact skill level brief standard full compression message user assistant system error "
    "report quarterly revenue customer search query page limit status latency span trace"
).split()
HANZI = (
    "上下文窗口工具调用结果观察摘要重试超时产物技能级别压缩消息用户助手系统错误报告季度收入客户搜索"
    "查询页面限制状态延迟追踪我们需要先检查数据然后生成最终答案并记录每一步的耗时与令牌使用情况"
)


def english(rng: random.Random, size: int) -> str:
    words: list[str] = []
    while sum(len(w) + 1 for w in words) < size:
        sentence = [rng.choice(WORDS) for _ in range(rng.randint(6, 18))]
        words.extend(sentence[:-1] + [sentence[-1] + rng.choice(".,;!?")])
    return " ".join(words).capitalize()


def chinese(rng: random.Random, size: int) -> str:
    chars = size // 3  # three UTF-8 bytes per character
    return "".join(rng.choice(HANZI) if i % 17 else "，" for i in range(1, chars + 1)) + "。"


def json_output(rng: random.Random, size: int) -> str:
    rows: list[dict[str, object]] = []
    while len(json.dumps(rows, ensure_ascii=False)) < size - 120:
        rows.append({
            "id": rng.randint(1, 10**6),
            "name": rng.choice(WORDS) + "_" + rng.choice(WORDS),
            "城市": "".join(rng.choice(HANZI) for _ in range(3)),
            "score": round(rng.random() * 100, 3),
            "ok": rng.random() > 0.2,
        })
    return json.dumps({"status": "ok", "rows": rows}, ensure_ascii=False)


def corpus(total_bytes: int, seed: int = 20240611) -> list[str]:
    rng = random.Random(seed)
    makers = (english, chinese, json_output)
    messages: list[str] = []
    size = 0
    while size < total_bytes:
        message = makers[len(messages) % 3](rng, rng.randint(2048, 4096))
        messages.append(message)
        size += len(message.encode("utf-8"))
    return messages


def best_of(repeat: int, runs: dict[str, Callable[[], int]]) -> dict[str, tuple[float, int]]:
    best: dict[str, tuple[float, int]] = {}
    for _ in range(repeat):
        for name, run in runs.items():
            start = time.perf_counter()
            result = run()
            elapsed = time.perf_counter() - start
            if name not in best or elapsed < best[name][0]:
                best[name] = (elapsed, result)
    return best


MODELS = {"cl100k_base": "anthropic/claude-3-5-sonnet-20241022", "o200k_base": "gpt-4o"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=10.0, help="size of the text in MB (default 10)")
    parser.add_argument("--repeat", type=int, default=5, help="runs per figure; the best counts (default 5)")
    args = parser.parse_args()

    messages = corpus(int(args.mb * 1024 * 1024))
    whole = "\n".join(messages)
    megabytes = len(whole.encode("utf-8")) / (1024 * 1024)
    print(f"text: {megabytes:.1f} MB in {len(messages)} messages of 2-4 KB (English / Chinese / JSON)")
    runs: dict[str, Callable[[], int]] = {}
    for encoding_name, model in MODELS.items():
        encoding = tiktoken_encoding(encoding_name)  # the raw side: tiktoken itself, same ranks
        count_tokens("warm up", model)
        runs |= {
            f"{encoding_name} raw messages": lambda e=encoding: sum(len(e.encode(m, disallowed_special=())) for m in messages),
            f"{encoding_name} ours messages": lambda m_=model: sum(count_tokens(m, m_) for m in messages),
            f"{encoding_name} raw whole": lambda e=encoding: len(e.encode(whole, disallowed_special=())),
            f"{encoding_name} ours whole": lambda m_=model: count_tokens(whole, m_),
        }
    results = best_of(args.repeat, runs)
    for encoding_name, model in MODELS.items():
        profile = model_profile(model)
        if results[f"{encoding_name} ours whole"][1] != profile.scale(results[f"{encoding_name} raw whole"][1]):
            raise SystemExit(f"count_tokens disagrees with tiktoken × margin for {model}")
        print(f"{model} → family {profile.family}, encoding {profile.encoding_name}, margin {profile.margin}"
              f"{' (approximate)' if profile.approximate else ' (exact)'}")
        for shape in ("messages", "whole"):
            raw_s, raw_n = results[f"{encoding_name} raw {shape}"]
            ours_s, _ = results[f"{encoding_name} ours {shape}"]
            print(
                f"  {shape:>8}: tiktoken {megabytes / raw_s:6.2f} MB/s   count_tokens {megabytes / ours_s:6.2f} MB/s"
                f"   ratio {ours_s / raw_s:.3f}   ({raw_n} raw tokens, best of {args.repeat})"
            )
    print(f"cpu: {os.cpu_count()} cores shared with other work; figures vary with load")
    print(f"reproduce: .venv/bin/python bench/tokens.py --mb {args.mb:g} --repeat {args.repeat}")


if __name__ == "__main__":
    main()
