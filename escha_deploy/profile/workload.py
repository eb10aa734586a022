"""A workload the host tier should bring back: ``COUNTxTOKENS`` distinct prefixes, each asked
twice (``hicache.workload``, ``plan --workload``). Read by ``planner.reach``. Pure."""

from __future__ import annotations

import re
from dataclasses import dataclass

#: Bounds of a workload: more is not a box this tool plans (a bound, not a policy).
MAX_PREFIXES = 100_000
MAX_PREFIX_TOKENS = 10_000_000


@dataclass(frozen=True)
class Workload:
    """``prefixes`` distinct prompts of ``prefix_tokens`` shared tokens, each with a
    ``question_tokens`` question answered in ``answer_tokens``, asked twice (the second time
    with another question). Defaults: the bench's question and answer (``escha-deploy bench``)."""

    prefixes: int
    prefix_tokens: int
    question_tokens: int = 16
    answer_tokens: int = 8

    @property
    def prompt_tokens(self) -> int:
        return self.prefix_tokens + self.question_tokens

    def label(self) -> str:
        return f"{self.prefixes} x {self.prefix_tokens:,} tokens"


def parse_workload(text: str) -> Workload:
    """``COUNTxTOKENS`` (``8x18000``, ``8x18K``; K = 1,000) as a ``Workload``. Raises
    ``ValueError`` with the expected form for anything else (a count or size below 1)."""
    m = re.fullmatch(r"\s*([0-9]{1,9})\s*[xX]\s*([0-9]{1,12})\s*([kK]?)\s*", text.replace("_", "").replace(",", ""))
    count = int(m.group(1)) if m else 0
    tokens = int(m.group(2)) * (1000 if m and m.group(3) else 1) if m else 0
    if not m or not 1 <= count <= MAX_PREFIXES or not 1 <= tokens <= MAX_PREFIX_TOKENS:
        raise ValueError(f"{text[:40]!r}: expected COUNTxTOKENS, e.g. 8x18000 or 8x18K (1 to {MAX_PREFIXES:,} "
                         f"prefixes of 1 to {MAX_PREFIX_TOKENS:,} tokens)")
    return Workload(prefixes=count, prefix_tokens=tokens)
