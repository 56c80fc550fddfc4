"""pipeline.ingest.decode.decompress: gzip and deflate bodies, several members, truncated, capped.

Every test carries a timeout: the inflate loop once never ended on a two-member body, and a
regression there must fail the run, not hang it.
"""

from __future__ import annotations

import gzip
import zlib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.ingest.decode.decompress import CHUNK, MAX_MEMBERS, BodyTooLarge, CorruptBody, decompress

pytestmark = pytest.mark.timeout(120)


def test_it_inflates_two_gzip_members_whose_first_is_over_one_chunk():
    body = gzip.compress(b"\0" * (2**20 + 1)) * 2  # hung the process: an endless inflate loop

    assert decompress(body, "gzip", 8 * 2**20) == b"\0" * (2 * (2**20 + 1))


def test_it_refuses_two_members_that_together_pass_the_cap():
    member = gzip.compress(b"\0" * (2**20 + 1))

    with pytest.raises(BodyTooLarge):
        decompress(member * 2, "gzip", 2**21)


def test_it_reads_zero_padding_after_a_member_as_gzip_does():
    body = gzip.compress(b"one") + b"\0" * 5 + gzip.compress(b"two") + b"\0" * 3

    assert decompress(body, "gzip", 100) == gzip.decompress(body) == b"onetwo"


@pytest.mark.parametrize("body", [b"\x1f\x8b", gzip.compress(b"x" * 100)[:-1], gzip.compress(b"a") + b"junk"],
                         ids=["header-only", "no-trailer", "garbage-after-a-member"])
def test_it_refuses_truncated_or_garbage_gzip_as_corrupt(body):
    with pytest.raises(CorruptBody):
        decompress(body, "gzip", 1000)


# ---- fuzzing: members of every kind, concatenated, truncated, padded, under and over the cap ----

# Runs of one byte compress well, so members inflate past a chunk without big bodies.
plain = st.one_of(st.binary(max_size=200),
                  st.tuples(st.binary(min_size=1, max_size=3), st.integers(0, CHUNK + 4096)).map(
                      lambda pair: pair[0] * (pair[1] // len(pair[0]))))


def _raw_deflate(data: bytes, level: int) -> bytes:
    packer = zlib.compressobj(level, zlib.DEFLATED, -zlib.MAX_WBITS)
    return packer.compress(data) + packer.flush()


FRAMINGS = {
    "gzip": lambda data, level: gzip.compress(data, compresslevel=level),
    "zlib": lambda data, level: zlib.compress(data, level),
    "raw": _raw_deflate,
}


@st.composite
def bodies(draw) -> tuple[str, bytes, bytes, bool]:
    """(Content-Encoding, body, what it inflates to if whole, whether the body was damaged)."""
    framing = draw(st.sampled_from(sorted(FRAMINGS)))
    level = draw(st.integers(0, 9))
    payloads = draw(st.lists(plain, min_size=1, max_size=3))
    members = [FRAMINGS[framing](payload, level) for payload in payloads]
    if framing == "gzip":
        members = [member + b"\0" * draw(st.integers(0, 2)) for member in members]
    body = b"".join(members)
    damage = draw(st.sampled_from(["none", "truncate", "garbage"]))
    if damage == "truncate":
        body = body[:draw(st.integers(0, max(0, len(body) - 1)))]
    elif damage == "garbage":
        body += draw(st.binary(min_size=1, max_size=20).filter(lambda junk: junk.strip(b"\0")))
    encoding = "gzip" if framing == "gzip" else "deflate"
    return encoding, body, b"".join(payloads), damage != "none"


def _reference(encoding: str, body: bytes, whole: bytes) -> bytes | None:
    """What a gzip body inflates to by the standard library, None when it is not valid gzip."""
    if encoding != "gzip":
        return whole
    try:
        return gzip.decompress(body)
    except (OSError, EOFError, zlib.error):
        return None


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(case=bodies(), limit=st.sampled_from([0, 100, CHUNK, CHUNK + 1, 2 * CHUNK + 4096, 8 * CHUNK]))
def test_fuzzed_gzip_and_deflate_bodies_inflate_like_the_standard_library_within_the_cap(case, limit):
    encoding, body, whole, damaged = case
    try:
        outcome: bytes | str = decompress(body, encoding, limit)
    except BodyTooLarge:
        outcome = "too large"
    except CorruptBody:
        outcome = "corrupt"

    if encoding == "gzip" or not damaged:
        expected = _reference(encoding, body, whole)
        if expected is not None:
            assert outcome == (expected if len(expected) <= limit else "too large")
        else:  # refused: too large only when inflating what was there already passed the cap
            assert outcome == "corrupt" or (outcome == "too large" and len(whole) > limit)
    else:  # damaged deflate has no gzip.decompress to compare with: a cut between members, or
        # garbage that happens to be a raw deflate stream, is valid deflate
        assert outcome in ("corrupt", "too large") or len(outcome) <= limit


@pytest.mark.parametrize("body", [zlib.compress(b"x" * 1000)[:-2], zlib.compress(b"a") + b"\xff\xfe\xfd",
                                  _raw_deflate(b"y" * 5000, 6)[:-3]],
                         ids=["zlib-no-checksum", "zlib-then-garbage", "raw-cut"])
def test_it_refuses_truncated_or_garbage_deflate_as_corrupt(body):
    with pytest.raises(CorruptBody):
        decompress(body, "deflate", 10_000)


def test_many_small_members_are_read_whole_and_too_many_are_refused():
    """Copying the rest of the body after each member was quadratic (4 MiB of empty members took
    14 s of a request thread, found in review): members are read from a position in the body, and
    a body of more members than any exporter sends is refused."""
    small = b"".join(gzip.compress(bytes([i % 256]) * 100) for i in range(MAX_MEMBERS))
    assert decompress(small, "gzip", 64 * CHUNK) == gzip.decompress(small)
    too_many = gzip.compress(b"") * (MAX_MEMBERS + 1)
    with pytest.raises(CorruptBody, match=f"more than {MAX_MEMBERS} members"):
        decompress(too_many, "gzip", 64 * CHUNK)
