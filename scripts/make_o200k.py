"""Rebuild pipeline/tokens/encodings/o200k_base.tiktoken from the npm package js-tiktoken (MIT).

Run from the repository root:  .venv/bin/python scripts/make_o200k.py

A build-time step, never run by the server or the runtime: it downloads the pinned
js-tiktoken tarball from the npm registry, checks the tarball's sha512 against the
registry's published integrity value, reads `dist/ranks/o200k_base.cjs` and writes its ranks
in tiktoken's file format (one "base64-token rank" line per token, by rank). The result must
hash to the sha256 tiktoken pins for o200k_base (tiktoken_ext/openai_public.py); the script
refuses to write anything else. pipeline/tokens/encodings.py checks the same hash at load.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import sys
import tarfile
import urllib.request
from pathlib import Path

VERSION = "1.0.21"
TARBALL = f"https://registry.npmjs.org/js-tiktoken/-/js-tiktoken-{VERSION}.tgz"
INTEGRITY = "sha512-biOj/6M5qdgx5TKjDnFT1ymSpM5tbd3ylwDtrQvFQSu0Z7bBYko2dF+W/aUkXUPuk6IVpRxk/3Q2sHOzGlS36g=="
MEMBER = "package/dist/ranks/o200k_base.cjs"
O200K_SHA256 = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"
OUT = Path(__file__).resolve().parent.parent / "pipeline" / "tokens" / "encodings" / "o200k_base.tiktoken"


def ranks_from_cjs(source: str) -> dict[str, int]:
    """js-tiktoken's compact form: per line "<marker> <first rank> <token> <token> …", ranks consecutive."""
    body = source.strip().removeprefix("module.exports = ").removesuffix(";")
    lines = [line for line in json.loads(body)["bpe_ranks"].split("\n") if line]
    ranks: dict[str, int] = {}
    for line in lines:
        _, first, *tokens = line.split(" ")
        for i, token in enumerate(tokens):
            ranks[token] = int(first) + i
    return ranks


def tiktoken_file(ranks: dict[str, int]) -> bytes:
    for token in ranks:
        base64.b64decode(token, validate=True)
    return "".join(f"{token} {rank}\n" for token, rank in sorted(ranks.items(), key=lambda kv: kv[1])).encode()


def main() -> None:
    with urllib.request.urlopen(TARBALL, timeout=60) as response:
        tarball = response.read()
    digest = "sha512-" + base64.b64encode(hashlib.sha512(tarball).digest()).decode()
    if digest != INTEGRITY:
        sys.exit(f"js-tiktoken {VERSION} tarball integrity mismatch: {digest}")
    with tarfile.open(fileobj=io.BytesIO(tarball), mode="r:gz") as archive:
        extracted = archive.extractfile(MEMBER)
        if extracted is None:
            sys.exit(f"{MEMBER} missing from the tarball")
        data = tiktoken_file(ranks_from_cjs(extracted.read().decode("utf-8")))
    if hashlib.sha256(data).hexdigest() != O200K_SHA256:
        sys.exit("converted ranks do not match tiktoken's pinned o200k_base sha256; nothing written")
    OUT.write_bytes(data)
    tokens = data.count(b"\n")
    print(f"wrote {OUT.name}: {tokens} tokens, sha256 {O200K_SHA256}")


if __name__ == "__main__":
    main()
