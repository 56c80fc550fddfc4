"""clean_text replaces exactly what the databases refuse (NUL, UTF-16 surrogates) with U+FFFD,
whichever of its paths a text takes: ASCII, other text without NUL, text with NUL; clean_attributes,
which tests the common case inline, cleans every key and value as clean_value would."""

from __future__ import annotations

import math

import pytest

from pipeline.ingest.write.sanitise import clean_attributes, clean_text

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


def test_clean_attributes_cleans_what_its_inline_check_lets_through_to_clean_value():
    big, nested = 2**70, {"k\x00": ["\ud800", 2**64]}
    attributes = {
        "ascii": "plain", "中文": "中文 é", "nul\x00key": "v", "surrogate \udfff": "v", 7: "int key",
        "nul value": "a\x00b", "surrogate value": "中 \ud800", "int": 2**63 - 1, "low int": -(2**63),
        "big": big, "negative": -(2**63) - 1, "bool": True, "none": None, "float": 0.5, "nan": math.nan,
        "inf": -math.inf, "bytes": b"\x00\xff", "nested": nested, "list": ("x\x00", 1.5),
    }

    cleaned = clean_attributes(attributes)

    assert list(cleaned.items()) == [
        ("ascii", "plain"), ("中文", "中文 é"), ("nul\ufffdkey", "v"), ("surrogate \ufffd", "v"), ("7", "int key"),
        ("nul value", "a\ufffdb"), ("surrogate value", "中 \ufffd"), ("int", 2**63 - 1), ("low int", -(2**63)),
        ("big", str(big)), ("negative", str(-(2**63) - 1)), ("bool", True), ("none", None), ("float", 0.5),
        ("nan", "nan"), ("inf", "-inf"), ("bytes", b"\x00\xff"), ("nested", {"k\ufffd": ["\ufffd", str(2**64)]}),
        ("list", ["x\ufffd", 1.5]),
    ]
    assert cleaned["bool"] is True  # not 1
    assert cleaned is not attributes and "nul\x00key" in attributes  # a new dict: the span's own is left as it was
    assert cleaned["中文"] is attributes["中文"]  # storable text is kept, not copied


def test_clean_attributes_keeps_the_last_of_keys_that_clean_alike():
    assert clean_attributes({"a\x00": 1, "a\ufffd": 2, 3: "x", "3": "y"}) == {"a\ufffd": 2, "3": "y"}
