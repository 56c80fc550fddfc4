"""The wording of a call's diff line: counts, signed token changes in k/M, the first call."""

from __future__ import annotations

from dashboard.diff_lines import DiffLine, signed_tokens


def line(**fields) -> DiffLine:
    values = dict(previous_call_id=1, added=0, removed=0, changed=0, token_delta=0, kept_prefix_messages=0,
                  kept_prefix_tokens=0, cache_read_tokens=0, cache_break=False, cache_break_reason=None,
                  uncacheable_tokens=0)
    return DiffLine(**{**values, **fields})


def test_it_reads_like_the_issue_says():
    diff = line(added=2, token_delta=1234, kept_prefix_messages=12, kept_prefix_tokens=8100)

    assert f"{diff.changes}; {diff.prefix}" == "+2 messages, +1.2k tokens; prefix kept 12 messages / 8.1k tokens"


def test_it_counts_one_message_in_the_singular_and_signs_every_change():
    diff = line(added=1, removed=1, changed=3, token_delta=-2_500_000, kept_prefix_messages=1, kept_prefix_tokens=7)

    assert diff.changes == "+1 message, −1 message, 3 changed, −2.5M tokens"
    assert diff.prefix == "prefix kept 1 message / 7 tokens"
    assert line(token_delta=0).changes == "no new messages, ±0 tokens"
    assert [signed_tokens(n) for n in (1, -999, 1000, 0)] == ["+1", "−999", "+1k", "±0"]


def test_the_first_call_gives_its_size():
    diff = line(previous_call_id=None, added=1, token_delta=5200)

    assert diff.first is True
    assert diff.changes == "1 message, 5.2k tokens"
    assert line(kept_prefix_messages=0).prefix == "no prefix kept"
