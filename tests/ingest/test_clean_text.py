"""clean_text replaces exactly what the databases refuse (NUL, UTF-16 surrogates) with U+FFFD,
whichever of its paths a text takes: ASCII, other text without NUL, text with NUL."""

from __future__ import annotations

import pytest

from pipeline.ingest.write.sanitise import clean_text

CASES = [
    ("plain ascii", "plain ascii"),
    ("nul\x00ascii", "nul\ufffdascii"),
    ("中文 and é", "中文 and é"),
    ("中文\x00", "中文\ufffd"),
    ("lone \ud800 surrogate", "lone \ufffd surrogate"),
    ("中文 \udfff", "中文 \ufffd"),
    ("pair \ud83d\ude00 as two code points", "pair \ufffd\ufffd as two code points"),
    ("both \x00 and \ud800 中", "both \ufffd and \ufffd 中"),
    ("emoji 😀 is one code point", "emoji 😀 is one code point"),
]


@pytest.mark.parametrize(("text", "stored"), CASES)
def test_clean_text_replaces_nul_and_surrogates_only(text, stored):
    cleaned = clean_text(text)
    assert cleaned == stored
    cleaned.encode()  # what the database driver does: no UnicodeEncodeError
    assert "\x00" not in cleaned


def test_clean_text_keeps_a_storable_text_as_it_is():
    text = "中文 " * 1000
    assert clean_text(text) is text
