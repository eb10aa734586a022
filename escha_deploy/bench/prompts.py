"""Deterministic prompts from a seed, so that two runs (and two servers) see the same tokens.

A prompt is a ledger of records ("Entry 812: the amber-falcon code is 58213.") drawn from
``random.Random(f"{seed}:{namespace}:{index}")``. Python seeds a ``str`` through SHA-512
(``random.seed`` version 2), so the text does not depend on ``PYTHONHASHSEED``, the platform
or the Python build. Records carry facts a question can ask about, which the canary uses:
a damaged prefix body changes the answer, not only its wording (sglang#39830 saw exactly that).

Sizing: when the server has a tokenizer endpoint (SGLang 0.5.19 ``POST /v1/tokenize``,
``entrypoints/openai/serving_tokenize.py``), the text is tokenized there and cut to exactly the
asked number of tokens, and the token ids are what is sent (``/v1/completions`` accepts a list
of ids as ``prompt``), so both servers of a comparison get identical tokens. Without one, the
text is sized by ``CHARS_PER_TOKEN_GUESS`` and the server's ``usage.prompt_tokens`` is the
count that the figures use.
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from escha_deploy.utils.errors import Failed

#: Characters per token for sizing text when the server has no tokenizer endpoint. A guess
#: for English-like text with BPE tokenizers (roughly 3.5 to 4.5); the figures never use it,
#: they use the server's usage.prompt_tokens.
CHARS_PER_TOKEN_GUESS = 3.6

_ADJECTIVES = (
    "amber", "brisk", "cobalt", "dusky", "eager", "frosty", "gilded", "hollow", "ivory",
    "jagged", "keen", "lunar", "mossy", "nimble", "opal", "plain", "quiet", "russet", "silver",
    "tidal", "umber", "vivid", "woolen", "young", "zesty", "coral", "misty", "rapid", "stony",
    "velvet",
)
_NOUNS = (
    "falcon", "harbor", "lantern", "meadow", "orchard", "pebble", "quarry", "river", "saddle",
    "thistle", "valley", "willow", "anchor", "beacon", "canyon", "delta", "ember", "forge",
    "glacier", "hamlet", "island", "juniper", "kettle", "ledger", "mason", "needle", "otter",
    "prairie", "raven", "summit",
)


@dataclass(frozen=True)
class Record:
    """One fact in a ledger: entry number, a two-word name, a five-digit code."""

    entry: int
    name: str
    code: int

    def text(self) -> str:
        return f"Entry {self.entry}: the {self.name} code is {self.code}."


def records(seed: int, namespace: str, index: int, count: int) -> list[Record]:
    """``count`` records for one prompt, the same for the same (seed, namespace, index).

    The first entry number is drawn from the stream too, so distinct prompts differ from
    their first token on (no shared prefix for the radix cache to match).
    """
    rng = random.Random(f"{seed}:{namespace}:{index}")
    start = rng.randrange(10_000, 90_000)
    out = []
    for i in range(count):
        name = f"{rng.choice(_ADJECTIVES)}-{rng.choice(_NOUNS)}"
        out.append(Record(entry=start + i, name=name, code=rng.randrange(10_000, 100_000)))
    return out


def ledger_text(recs: list[Record]) -> str:
    """The records as one line each."""
    return "\n".join(r.text() for r in recs) + "\n"


def question_text(recs: list[Record], seed: int, which: str) -> tuple[str, list[int]]:
    """A question about three records of the ledger, and the codes a correct answer holds.

    ``which`` picks the question (``"q1"``, ``"q2"``, ``"canary"``), so the two passes of the
    benchmark reuse the prefix with a different suffix.
    """
    rng = random.Random(f"{seed}:question:{which}:{len(recs)}")
    picks = sorted(rng.sample(range(len(recs)), k=min(3, len(recs))))
    asked = [recs[i] for i in picks]
    entries = ", ".join(str(r.entry) for r in asked)
    text = (
        f"\nQuestion ({which}): list the codes of entries {entries}, in that order, "
        "as numbers separated by commas.\nAnswer:"
    )
    return text, [r.code for r in asked]


Tokenize = Callable[[str], Awaitable[list[int] | None]]


@dataclass(frozen=True)
class Prompt:
    """A prompt ready to send: ``payload`` is a ``str`` or a list of token ids.

    ``tokens`` is the exact count when ``exact`` (ids from the server's tokenizer), otherwise
    the sizing guess; ``expected_codes`` are the codes a correct answer names (canary only).
    """

    payload: str | list[int]
    tokens: int
    exact: bool
    expected_codes: tuple[int, ...] = ()


async def sized_text(
    seed: int, namespace: str, index: int, target_tokens: int, tokenize: Tokenize | None
) -> tuple[str | list[int], int, bool, list[Record]]:
    """Ledger text of ``target_tokens`` tokens: ids cut to size if ``tokenize`` works.

    Returns ``(payload, tokens, exact, records)``. ``tokenize`` returns ``None`` when the
    server has no tokenizer endpoint; then the payload is text sized by
    ``CHARS_PER_TOKEN_GUESS``. Raises ``ValueError`` for ``target_tokens < 1``.
    """
    if target_tokens < 1:
        raise ValueError(f"target_tokens must be at least 1, got {target_tokens}")
    # one record is about 40 characters; ask for 25 % more than the guess so one round is enough
    per_record = 40
    count = max(1, int(target_tokens * CHARS_PER_TOKEN_GUESS * 1.25 / per_record) + 1)
    for _ in range(6):
        recs = records(seed, namespace, index, count)
        text = ledger_text(recs)
        ids = await tokenize(text) if tokenize is not None else None
        if ids is None:
            cut = int(target_tokens * CHARS_PER_TOKEN_GUESS)
            text = text[:cut]
            whole, used = [], 0
            for r in recs:  # the records that end before the cut
                used += len(r.text()) + 1
                if used > cut:
                    break
                whole.append(r)
            return text, target_tokens, False, whole or recs[:1]
        if len(ids) >= target_tokens:
            # records spread evenly over the ids; keep those well inside the cut (90 %)
            usable = max(1, int(len(recs) * (target_tokens / len(ids)) * 0.9))
            return ids[:target_tokens], target_tokens, True, recs[:usable]
        count = int(count * (target_tokens / max(1, len(ids))) * 1.1) + 2
    raise Failed(f"the server's tokenizer never gave {target_tokens} tokens for the "
                 f"{namespace} prompt {index}: /v1/tokenize answers look wrong")


async def make_prompt(
    seed: int,
    namespace: str,
    index: int,
    prefix_tokens: int,
    tokenize: Tokenize | None,
    question: str | None = None,
) -> Prompt:
    """A ledger prefix of ``prefix_tokens`` tokens plus, if ``question``, a question suffix.

    With a tokenizer the prompt is ``prefix ids + question ids`` (ids concatenated, so the
    prefix is token-identical across questions and the radix cache can match all of it).
    """
    return (await make_prompts(seed, namespace, index, prefix_tokens, tokenize,
                               [question]))[0]


async def make_prompts(
    seed: int,
    namespace: str,
    index: int,
    prefix_tokens: int,
    tokenize: Tokenize | None,
    questions: list[str | None],
) -> list[Prompt]:
    """One prefix, sized once, with each of ``questions`` after it (``None``: no question).

    Raises ``Failed`` when the tokenizer endpoint stops answering half way.
    """
    payload, tokens, exact, recs = await sized_text(seed, namespace, index, prefix_tokens, tokenize)
    out = []
    for question in questions:
        if question is None:
            out.append(Prompt(payload=payload, tokens=tokens, exact=exact))
            continue
        qtext, codes = question_text(recs, seed, question)
        if isinstance(payload, list):
            qids = await tokenize(qtext) if tokenize is not None else None
            if qids is None:
                raise Failed("the server's tokenizer endpoint stopped answering")
            out.append(Prompt(payload=payload + qids, tokens=tokens + len(qids), exact=True,
                              expected_codes=tuple(codes)))
        else:
            est = int(len(qtext) / CHARS_PER_TOKEN_GUESS)
            out.append(Prompt(payload=payload + qtext, tokens=tokens + est, exact=False,
                              expected_codes=tuple(codes)))
    return out
