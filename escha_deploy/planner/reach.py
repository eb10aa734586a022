"""Which cached prefixes of a workload can come back on a hybrid (GDN/mamba) model with HiCache.

A workload here is the bench's: ``prefixes`` distinct prompts of ``prefix_tokens`` shared
tokens plus a ``question_tokens`` question, each answered with ``answer_tokens``, asked one
after another; then each prefix again with another question (the second pass). Pure: no I/O.

The rules, read from SGLang 0.5.19's code and checked against its own radix cache replayed on
the CPU (``tests/replay/sglang_tree_replay.py``; the figures are pinned in
``tests/planner/test_reach.py``):

- A hybrid prefix is reusable only up to a tree node holding a mamba state, on the device or on
  the host for a load-back (``unified_cache/components/mamba_component.py:
  create_match_validator``). With ``--mamba-radix-cache-strategy extra_buffer`` a prompt leaves
  one state at each prefill chunk's end, on the model's mamba chunk grid (``schedule_batch.py:
  _mamba_radix_cache_v2_req_prepare_for_extend``: ``len(prefix) + (extend_len // grid) * grid``,
  when the extend is at least one grid), so ``state_positions``.
- A match never passes the shared prefix, nor the prompt's last token (``Req.
  _compute_max_prefix_len``), so a prefix comes back to its deepest state at or below
  ``prefix_tokens``. The last chunk's state reaches the host only when its node outlives the
  device's own evictions (the replay: it does on a 210,000-token device pool, not on a
  28,672-token one), so the prediction is the deepest *full-chunk* state (``restore_tokens``),
  and the last chunk's state is the upper end (``restore_tokens_max``).
- Under ``write_through`` every inserted node is backed up with its state, one host mamba slot
  per state (``UnifiedRadixCache._execute_kv_backup`` -> ``HostPoolGroup.resolve_host_transfers``);
  the host pools reclaim least recently used entries when full (``evict_host``). A workload
  whose states or tokens overflow a host pool cycles through it LRU and can find none of its
  prefixes on the second pass (the replay: 0 of 8 at ``--hicache-ratio 1``). So every prefix is
  *guaranteed* to come back when the host pools hold both passes without reclaiming:
  ``host_mamba_slots >= states_needed`` and ``host_kv_tokens >= kv_tokens_needed``.
- Under ``write_back`` 0.5.19 backs up only evicted device leaves and drops chunk states on
  internal nodes (``_evict_components``): nothing is guaranteed (the replay: 0 of 8).

Units: tokens, slots (one mamba state of every GDN layer of a rank), prefixes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ..profile.workload import Workload, parse_workload

__all__ = ["MAMBA_GRID", "Reach", "Workload", "needs", "parse_workload", "reach", "state_positions"]

#: The mamba chunk grid of a Qwen3.5-class config without ``mamba_chunk_size``: FLA's chunk, 64
#: (``configs/mamba_utils.py``; ``ServerArgs._mamba_cache_chunk_size``).
MAMBA_GRID = 64

Verdict = Literal["all", "not_guaranteed", "none"]


def state_positions(start: int, end: int, chunk: int, grid: int = MAMBA_GRID) -> list[int]:
    """Sequence lengths at which a prefill of tokens ``[start, end)`` in chunks of ``chunk``
    leaves a mamba state (extra_buffer): each chunk's end rounded down to the grid, when the
    chunk is at least one grid long. Closed form (no loop over tokens)."""
    if end <= start or chunk < 1:
        return []
    full, rest = divmod(end - start, chunk)
    out = [start + (k - 1) * chunk + (chunk // grid) * grid for k in range(1, full + 1)] if chunk >= grid else []
    if rest >= grid:
        out.append(start + full * chunk + (rest // grid) * grid)
    return out


@dataclass(frozen=True)
class Reach:
    """What a workload gets back from the host tier, per rank.

    ``verdict``: ``all`` (every prefix comes back: the host pools hold both passes without
    reclaiming), ``none`` (no state below the shared prefix, or write_back), ``not_guaranteed``
    (a host pool reclaims: LRU may leave none, as the replay shows at ratio 1).
    ``restored``: prefixes predicted back (``prefixes`` for ``all``, 0 otherwise);
    ``restore_tokens``: tokens each comes back with (the deepest full-chunk state within the
    prefix), ``restore_tokens_max`` when the last chunk's state reaches the host too;
    ``states_needed`` / ``kv_tokens_needed``: host mamba slots / host KV tokens both passes
    take; ``why``: one line."""

    workload: Workload
    verdict: Verdict
    restored: int
    restore_tokens: int
    restore_tokens_max: int
    states_needed: int
    kv_tokens_needed: int
    host_mamba_slots: int
    host_kv_tokens: int
    why: str

    @property
    def restored_tokens(self) -> int:
        """Tokens the second pass reuses, at the prediction (``restored x restore_tokens``)."""
        return self.restored * self.restore_tokens


def needs(w: Workload, chunk: int, grid: int = MAMBA_GRID) -> tuple[int, int, int, int]:
    """``(restore_tokens, restore_tokens_max, states_needed, kv_tokens_needed)`` of workload
    ``w`` at chunked prefill ``chunk`` (see ``Reach``). First pass: every chunk state of each
    prompt and its tokens (prompt + answer); second pass: the states and tokens prefilled past
    the restored point, and the answer."""
    first = state_positions(0, w.prompt_tokens, chunk, grid)
    full = [p for p in first if p % chunk == 0 and p <= w.prefix_tokens]
    within = [p for p in first if p <= min(w.prefix_tokens, w.prompt_tokens - 1)]
    restore = max(full, default=0)
    restore_max = max(within, default=0)
    again = state_positions(restore, w.prompt_tokens, chunk, grid)
    states = w.prefixes * (len(first) + len(again))
    kv = w.prefixes * ((w.prompt_tokens + w.answer_tokens) + (w.prompt_tokens - restore + w.answer_tokens))
    return restore, restore_max, states, kv


def reach(w: Workload, *, chunk: int, host_kv_tokens: int, host_mamba_slots: int, write_policy: str,
          strategy: str = "extra_buffer", grid: int = MAMBA_GRID) -> Reach:
    """The workload's second pass against host pools of ``host_kv_tokens`` tokens and
    ``host_mamba_slots`` states (what SGLang allocates, its padding slot and page included),
    at chunked prefill ``chunk`` (tokens), ``--hicache-write-policy write_policy`` and
    ``--mamba-radix-cache-strategy strategy``. Raises ``ValueError`` for a chunk below 1."""
    if chunk < 1:
        raise ValueError(f"chunked prefill {chunk}: must be >= 1")
    restore, restore_max, states, kv = needs(w, chunk, grid)

    def out(verdict: Verdict, why: str) -> Reach:
        return Reach(workload=w, verdict=verdict, restored=w.prefixes if verdict == "all" else 0,
                     restore_tokens=restore, restore_tokens_max=restore_max, states_needed=states,
                     kv_tokens_needed=kv, host_mamba_slots=host_mamba_slots, host_kv_tokens=host_kv_tokens,
                     why=why)

    if strategy != "extra_buffer":
        return out("not_guaranteed", f"--mamba-radix-cache-strategy {strategy}: not modelled (extra_buffer is)")
    if write_policy == "write_back":
        return out("none", "write_back backs up only evicted device leaves and drops the chunk states on inner "
                           "nodes (unified_radix_cache.py: _evict_components, as read in the default release)")
    if restore == 0:
        return out("none", f"no chunk ends within the {w.prefix_tokens:,}-token prefix at chunked prefill "
                           f"{chunk:,}: the only state is past the shared tokens")
    short = []
    if host_mamba_slots < states:
        short.append(f"host mamba {host_mamba_slots:,} slots < {states:,} states")
    if host_kv_tokens < kv:
        short.append(f"host KV {host_kv_tokens:,} tokens < {kv:,}")
    if write_policy != "write_through":
        short.append(f"{write_policy} backs up only after hits: not modelled")
    if short:
        return out("not_guaranteed", "; ".join(short) + ": a host pool reclaims LRU, which can return none")
    return out("all", f"both passes fit: {states:,} states in {host_mamba_slots:,} host slots, "
                      f"{kv:,} tokens in {host_kv_tokens:,}")
