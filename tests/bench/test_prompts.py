"""Deterministic prompts: the same seed gives the same tokens; sizing uses the tokenizer."""

from __future__ import annotations

import asyncio

import pytest

from escha_deploy.bench.prompts import (
    CHARS_PER_TOKEN_GUESS,
    ledger_text,
    make_prompt,
    question_text,
    records,
)

from .standin_sglang import tokenize as standin_tokenize


async def _tok(text: str) -> list[int]:
    return standin_tokenize(text)


def test_same_seed_same_text_other_seed_other_text():
    a = ledger_text(records(7, "prefix", 3, 50))
    assert a == ledger_text(records(7, "prefix", 3, 50))
    assert a != ledger_text(records(8, "prefix", 3, 50))
    assert a != ledger_text(records(7, "prefix", 4, 50))


def test_known_first_record_pins_the_generator():
    # Pinned so a change of generator (which would make old runs incomparable) fails here.
    # (random.Random seeds a str through SHA-512, so this holds on every platform and Python.)
    two = records(0, "prefix", 0, 2)
    assert [r.text() for r in two] == [
        "Entry 14175: the gilded-summit code is 62215.",
        "Entry 14176: the tidal-pebble code is 53988.",
    ]


def test_distinct_prefixes_differ_early():
    texts = [ledger_text(records(0, "prefix", i, 5)) for i in range(8)]
    # after the shared word "Entry", the entry numbers differ
    assert len({t.split(":")[0] for t in texts}) == 8


def test_sized_to_exact_token_count_with_a_tokenizer():
    p = asyncio.run(make_prompt(1, "prefix", 0, 1234, _tok))
    assert p.exact and isinstance(p.payload, list) and len(p.payload) == 1234 == p.tokens


def test_question_suffix_keeps_the_prefix_token_identical():
    a = asyncio.run(make_prompt(1, "prefix", 0, 500, _tok, "q1"))
    b = asyncio.run(make_prompt(1, "prefix", 0, 500, _tok, "q2"))
    assert a.payload[:500] == b.payload[:500]
    assert a.payload[500:] != b.payload[500:]
    assert len(a.expected_codes) == 3


def test_question_asks_only_about_records_inside_the_cut():
    recs = records(1, "prefix", 0, 400)
    text, codes = question_text(recs[:10], 1, "canary")
    assert all(c in [r.code for r in recs[:10]] for c in codes)
    assert "Answer:" in text


def test_without_a_tokenizer_text_is_sized_by_the_guess():
    p = asyncio.run(make_prompt(1, "cold", 0, 1000, None))
    assert isinstance(p.payload, str) and not p.exact
    assert len(p.payload) == int(1000 * CHARS_PER_TOKEN_GUESS)


def test_zero_tokens_is_refused():  # a programming error, not a user one
    with pytest.raises(ValueError):
        asyncio.run(make_prompt(1, "cold", 0, 0, None))
