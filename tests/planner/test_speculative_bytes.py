"""Every byte a speculative configuration pins or takes (``runtime.speculative``, ``planner.draft``).

Real parts: model and draft folders generated here (a config.json and a safetensors file whose
header names an ``mtp.*`` tensor, the rest sparse), read and planned by the pipeline ``plan`` uses
(``pipeline.gather``, ``pipeline.decide``) and by the CLI. The expected figures are computed here
from SGLang 0.5.19's code, each line citing the function:

- packed draft KV in the host pool: ``speculative/base_spec_worker.py: _can_pack_hicache_mtp``
  (NEXTN/EAGLE with a draft that has MTP layers) and ``pool_host/mha.py: get_size_per_token``
  (``head_dim x head_num x (target + draft layers) x itemsize x 2``);
- a sidecar host pool for EAGLE3: ``hybrid_pool_assembler.py: build_full_draft_pools``;
- intermediate mamba states: ``kv_cache_configurator.py: _handle_max_mamba_cache``
  (``per_req x (capped_reqs + 1) x speculative_num_draft_tokens``);
- ``max_running_requests`` 48 when unset: ``arg_groups/speculative_hook.py: _handle_eagle_family``.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from escha_deploy.utils.errors import BadInput
from escha_deploy.pipeline import DescribedHost, ProfileTarget, decide, gather, resolve_runtime
from escha_deploy.pipeline.argv import server_args
from escha_deploy.profile import load_profile

PROFILE = "rtx5060ti-tp2-fp8"  # 16 full-attention layers, 2 KV heads of 256 per rank, fp8 KV: 16,384 B/token
NEXTN = ["runtime.speculative.algorithm=NEXTN", "runtime.speculative.num_steps=3", "runtime.speculative.eagle_topk=1",
         "runtime.speculative.num_draft_tokens=4"]
GiB = 2**30
PER_SLOT = 39_223_296  # the profile's mamba state per slot per rank (bf16 SSM state)


def own_folder(root: Path, *, mtp: int = 2 * 10**8, total: int = 16_200_000_000) -> Path:
    """The model's own folder with one MTP layer: its config.json (``mtp_num_hidden_layers: 1``)
    and one safetensors file of ``total`` bytes whose header names an ``mtp.*`` tensor of ``mtp``
    bytes (the profile's 16.2 GB of weights, the MTP layer among them)."""
    from tests.oracle.cases import config_json

    m = root / "own"
    m.mkdir()
    cfg = {**config_json(load_profile(PROFILE).model.architecture), "mtp_num_hidden_layers": 1}
    (m / "config.json").write_text(json.dumps(cfg))
    header = json.dumps({"mtp.fc.weight": {"dtype": "BF16", "shape": [mtp // 2], "data_offsets": [0, mtp]},
                         "model.embed_tokens.weight": {"dtype": "BF16", "shape": [(total - 4096 - mtp) // 2],
                                                       "data_offsets": [mtp, total - 4096]}}).encode()
    with open(m / "model.safetensors", "wb") as fh:
        fh.write(struct.pack("<Q", len(header)) + header)
        fh.truncate(total)
    return m


def planned(sets: list[str], *, host_ram: int, platform: str):
    prof = load_profile(PROFILE, sets)
    g = gather(prof, DescribedHost(host_ram, platform))
    return decide(prof, g, resolve_runtime(prof, g, ProfileTarget()))


def test_nextn_on_the_models_own_mtp_layer_packs_one_layer_into_the_host_pool(tmp_path):
    """The issue's case: NEXTN (3 steps, top-k 1, 4 draft tokens) with the model's own folder as
    the draft, at 15 GiB under WSL2: 17 layers of 1,024 B in the host pool per token per rank
    (16,384 without the draft), and the recommended ratio keeps the pinned total in the budget.

    The profile fixes max_total_tokens at 28,672; beside the draft's weights and the intermediate
    mamba states they no longer fit the device budget. SGLang does not refuse that: it caps the
    pool at the profiled value and warns (``kv_cache_configurator.py: _apply_token_constraints``),
    so the plan is ``ok`` at the capped size, says so, and renders it (before: ``unsafe``, exit 3,
    9.50 GB needed against a 9.03 GB static budget)."""
    m = own_folder(tmp_path)
    base = [f"model.host_dir={m}"]
    without = planned(base, host_ram=15 * GiB, platform="wsl2")
    p = planned(base + NEXTN + ["model.draft.path=/models/Qwen3.x-27B-GPTQ-Int4", f"model.draft.host_dir={m}"],
                host_ram=15 * GiB, platform="wsl2")
    assert without.verdict == "ok" and without.per_rank.device_kv_tokens == 28_672
    assert without.per_rank.host_kv_bytes_per_token == 16_384
    assert p.verdict == "ok", p.reasons
    r = p.per_rank
    assert r.host_kv_bytes_per_token == 256 * 2 * (16 + 1) * 1 * 2 == 17_408  # dim x heads x layers x fp8 x K,V
    # SGLang's profiled value: what the static budget leaves after the target's and the draft's
    # weights, the mamba pool (10 slots + 1) and the intermediate states (2 requests + 1) x 4
    # draft tokens, in cells of 16,384 + 1,024 B (kv_cache_configurator.py: _profile_available_bytes,
    # _handle_max_mamba_cache; pool_configurator.py: calculate_pool_sizes; page size 1)
    rest = (p.device.static_budget_bytes - r.weights_bytes - r.draft_weights_bytes - (10 + 1) * PER_SLOT
            - PER_SLOT * (2 + 1) * 4)
    assert r.device_mamba_intermediate_bytes == PER_SLOT * (2 + 1) * 4
    assert r.device_kv_tokens == rest // 17_408 == 1_410
    warning = next(w for w in p.warnings if w.startswith("runtime.max_total_tokens:"))
    assert "28,672" in warning and "1,410" in warning and "_apply_token_constraints" in warning
    argv = server_args(p, load_profile(PROFILE, base + NEXTN))
    assert argv[argv.index("--max-total-tokens") + 1] == "1410"
    ratio = p.hicache.ratio
    assert ratio is not None and r.host_kv_tokens == int(1_410 * ratio) + 1
    assert r.host_kv_bytes == r.host_kv_tokens * 17_408
    assert p.pinned_total_bytes <= p.budget.pinned_budget_bytes
    # every buffer list counts the packed layer: one K-and-V buffer of tokens x 17,408 B
    kv = next(b for b in r.host_buffers if b.name.startswith("host KV buffer"))
    assert kv.requested_bytes == r.host_kv_bytes
    rule = next(d for d in p.decisions if d.rule == "draft host KV per token (packed)")
    assert rule.value == 1024 and "_can_pack_hicache_mtp" in rule.reason and "get_size_per_token" in rule.reason


def test_nextn_without_a_draft_folder_still_packs_the_models_own_layer():
    """No ``model.draft``: SGLang drafts from ``--model-path`` (``tp_worker.py: _init_model_config``),
    whose Qwen3.5 MTP layer it packs into the host pool all the same."""
    p = planned(NEXTN, host_ram=64 * GiB, platform="linux")
    assert p.per_rank.host_kv_bytes_per_token == 17_408


@pytest.mark.parametrize("platform", ["linux", "wsl2"])
def test_intermediate_states_that_leave_no_kv_budget_are_refused_with_sglangs_numbers(cli, platform):
    """NEXTN with 4 draft tokens, 30 mamba slots and 6 requests: SGLang subtracts 31 x 39,223,296 B of
    slots and 39,223,296 x (min(6, 30 // 4) + 1) x 4 = 1,098,252,288 B of intermediate states from
    what the weights leave, nothing remains, and it raises "Loaded weights leave no GPU memory for the
    KV cache"; without speculation the same slots fit."""
    assert PER_SLOT * (min(6, 30 // 4) + 1) * 4 == 1_098_252_288
    sets = ["runtime.max_mamba_cache_size=30", "runtime.max_running_requests=6"]
    args = ["plan", "-p", PROFILE, "--host-ram", "32GiB", f"--{platform}", "-f", "json"]
    alone = cli(*args, *(a for s in sets for a in ("--set", s)))
    assert not any("Loaded weights leave no GPU memory" in x for x in json.loads(alone.out)["reasons"])
    r = cli(*args, *(a for s in sets + NEXTN for a in ("--set", s)))
    assert r.code == 3, r.err
    d = json.loads(r.out)
    assert d["per_rank"]["device_mamba_intermediate_bytes"] == 1_098_252_288
    line = next(x for x in d["reasons"] if "Loaded weights leave no GPU memory for the KV cache" in x)
    assert "1,215,922,176 B" in line and "1,098,252,288 B" in line and "_profile_available_bytes" in line


def test_sglangs_48_requests_bound_the_intermediate_states_when_unset():
    """Without ``runtime.max_running_requests`` SGLang sets 48 under speculation
    (``_handle_eagle_family``); the intermediate states then follow the slots: min(48, 10 // 4)."""
    p = planned(NEXTN + ["runtime.max_running_requests=null"], host_ram=64 * GiB, platform="linux")
    assert p.per_rank.device_mamba_intermediate_bytes == PER_SLOT * (min(48, 10 // 4) + 1) * 4
    rule = next(d for d in p.decisions if d.rule == "intermediate mamba states per rank")
    assert "48" in rule.reason and "_handle_eagle_family" in rule.reason


def test_sglangs_own_draft_shape_is_used_when_the_keys_are_unset():
    """Only the algorithm set: SGLang picks 3 steps, top-k 1, 4 draft tokens for this model
    (``_auto_choose_speculative_params``)."""
    p = planned(["runtime.speculative.algorithm=NEXTN"], host_ram=64 * GiB, platform="linux")
    assert p.per_rank.device_mamba_intermediate_bytes == PER_SLOT * (2 + 1) * 4
    # top-k 1 with other draft tokens: SGLang makes them steps + 1
    q = planned(NEXTN[:3] + ["runtime.speculative.num_draft_tokens=9"], host_ram=64 * GiB, platform="linux")
    assert q.per_rank.device_mamba_intermediate_bytes == PER_SLOT * (2 + 1) * 4


def test_a_partial_draft_shape_is_refused_naming_the_key():
    """``eagle_topk`` without ``num_steps``: SGLang's ``_handle_eagle_family`` asserts it unset."""
    p = planned(["runtime.speculative.algorithm=EAGLE", "runtime.speculative.eagle_topk=2"],
                host_ram=64 * GiB, platform="linux")
    assert p.verdict == "unsafe"
    assert any(x.startswith("runtime.speculative.eagle_topk: set without runtime.speculative.num_steps")
               for x in p.reasons), p.reasons


def test_an_eagle3_draft_gets_a_sidecar_host_pool_at_the_targets_tokens(tmp_path):
    """EAGLE3 never packs (``_can_pack_hicache_mtp``: not EAGLE3): SGLang builds a host pool over the
    draft's device pool at ``host_to_device_ratio = target host tokens / draft tokens``
    (``build_full_draft_pools``): one layer of 4 // 2 heads x 128 x fp8 x K,V = 512 B per token."""
    d = _eagle3_folder(tmp_path)
    p = planned(["runtime.speculative.algorithm=EAGLE3", "model.draft.path=/drafts/e3", f"model.draft.host_dir={d}"],
                host_ram=64 * GiB, platform="linux")
    r = p.per_rank
    assert r.host_kv_bytes_per_token == 16_384  # the target's pool keeps its own layers
    tokens = int(28_672 * (r.host_kv_tokens / 28_672)) // 1 * 1 + 1  # (S // page + 1) x page, page 1
    assert r.host_draft_kv_tokens == tokens and r.host_draft_kv_bytes == tokens * 512
    side = next(b for b in r.host_buffers if b.name == "host draft KV buffer (sidecar)")
    assert side.requested_bytes == r.host_draft_kv_bytes
    assert r.pinned_bytes == sum(b.pinned_bytes for b in r.host_buffers)


def _folder(root: Path, name: str, **over) -> Path:
    from tests.oracle.cases import config_json

    d = root / name
    d.mkdir()
    (d / "config.json").write_text(json.dumps({**config_json(load_profile(PROFILE).model.architecture), **over}))
    with open(d / "model.safetensors", "wb") as fh:
        fh.truncate(10**6)
    return d


@pytest.mark.parametrize("over,alg,what", [
    ({"architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next"}, "NEXTN", "are of other architectures"),
    ({"num_hidden_layers": 128}, "EAGLE", "the draft has more layers (128) than the model (64)"),
    ({"vocab_size": 151_936}, "EAGLE", "have vocabularies of 151,936 and 248,320 tokens"),
])
def test_a_draft_that_cannot_draft_for_the_model_is_one_line_naming_both_folders(tmp_path, over, alg, what):
    model = _folder(tmp_path, "model")
    draft = _folder(tmp_path, "draft", **over)
    prof = load_profile(PROFILE, [f"model.host_dir={model}", f"runtime.speculative.algorithm={alg}",
                                  "model.draft.path=/d", f"model.draft.host_dir={draft}"])
    with pytest.raises(BadInput) as e:
        gather(prof, DescribedHost(64 * GiB, "linux"))
    assert len(e.value.problems) == 1
    line = e.value.problems[0]
    assert line.startswith("model.draft.host_dir: ") and what in line
    assert str(draft) in line and str(model) in line


@pytest.mark.parametrize("flag, key", [
    ("--speculative-algorithm", "runtime.speculative.algorithm"),
    ("--speculative-num-steps", "runtime.speculative.num_steps"),
    ("--speculative-eagle-topk", "runtime.speculative.eagle_topk"),
    ("--speculative-num-draft-tokens", "runtime.speculative.num_draft_tokens"),
    ("--speculative-draft-model-path", "model.draft.path"),
])
def test_a_speculative_flag_in_extra_args_is_refused_as_its_keys(cli, flag, key):
    r = cli("plan", "-p", PROFILE, "--host-ram", "64GiB", "--set", f'runtime.extra_args=["{flag}", "4"]')
    assert r.code == 2, r.err
    assert f"{flag} is the flag of the profile key {key}; set {key} instead" in r.err


def _eagle3_folder(root: Path) -> Path:
    d = root / "e3"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "num_hidden_layers": 1,
        "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128, "hidden_size": 4096,
        "vocab_size": 248320}))
    with open(d / "model.safetensors", "wb") as fh:
        fh.truncate(10**8)
    return d


@pytest.mark.parametrize("release,padding", [("0.5.19", True), ("0.5.23", False)])
def test_the_draft_sidecar_is_sized_as_the_planned_release_sizes_it(tmp_path, release, padding):
    """0.5.19 builds the EAGLE3 sidecar as an independent pool at ``host_to_device_ratio = target
    host tokens / draft tokens``: ``int(tokens x ratio)`` floored to the 64-token page plus one
    padding page (``pool_host/base.py: HostKVCache.__init__``). 0.5.23 passes
    ``host_token_capacity = host_pool_group.logical_size`` (``hybrid_pool_assembler.py:
    build_full_draft_pools``): the target host pool's tokens, no padding page of its own. Each
    release's rule is its facts.yaml ``draft_host_pool``, and the plan says which it used."""
    from escha_deploy.sglang.releases import load_release

    d = _eagle3_folder(tmp_path)
    p = planned(["runtime.speculative.algorithm=EAGLE3", "model.draft.path=/drafts/e3", f"model.draft.host_dir={d}",
                 "runtime.page_size=64", "runtime.mamba_radix_cache_strategy=extra_buffer",
                 f"runtime.sglang_version={release}", "runtime.needs=[]"], host_ram=64 * GiB, platform="linux")
    assert p.sglang_release == release
    assert load_release(release).draft_host_pool.capacity == ("ratio" if padding else "shared")
    r = p.per_rank
    target = r.host_kv_tokens
    assert target % 64 == 0
    assert r.host_draft_kv_tokens == (target + 64 if padding else target)
    assert r.host_draft_kv_bytes == r.host_draft_kv_tokens * 512
    side = next(b for b in r.host_buffers if b.name == "host draft KV buffer (sidecar)")
    assert side.requested_bytes == r.host_draft_kv_bytes
    why = next(x.reason for x in p.decisions if x.rule == "host draft KV pool (sidecar)")
    assert ("no padding page of its own" in why) is not padding
    assert f"SGLang {release}" in why


def test_issue_40s_nextn_command_exits_0_and_says_the_cap(cli, tmp_path):
    """``plan -p rtx5060ti-tp2-fp8 --host-ram 15GiB --wsl2`` with NEXTN and the model's own folder
    as the draft, as a user types it: exit 0 (before: 3), the cap said with SGLang's figure."""
    m = own_folder(tmp_path)
    sets = [f"model.host_dir={m}", *NEXTN, "model.draft.path=/models/Qwen3.x-27B-GPTQ-Int4", f"model.draft.host_dir={m}"]
    r = cli("plan", "-p", PROFILE, "--host-ram", "15GiB", "--wsl2", *(a for s in sets for a in ("--set", s)))
    assert r.code == 0, r.err
    said = r.out + r.err
    assert "runtime.max_total_tokens: 28,672 tokens do not fit" in said and "profiled 1,410 tokens" in said


def test_a_kv_cell_of_0_bytes_is_not_capped_but_refused_by_its_rule(cli):
    """INT2 on a head_dim of 1 has no KV cell (0 B a token): the cap has nothing to divide by,
    and the plan refuses by the head_dim rule, one line, no traceback (the fuzz drew it)."""
    r = cli("plan", "-p", "rtx5060ti-tp2", "--host-ram", "64GiB", "--set", "model.architecture.head_dim=1")
    assert r.code == 3 and "Traceback" not in r.err + r.out
    assert "model.architecture.head_dim: INT2 packs 4 codes per byte" in r.out


def test_a_profile_minimum_refuses_a_cap_below_it_and_one_sglang_refuses_is_bad_input(cli, tmp_path):
    """``runtime.min_total_tokens``: the same NEXTN case with a profile that needs 2,048 tokens is
    refused naming the key and SGLang's 1,410; a minimum SGLang would not start with (below 2:
    ``managers/tp_worker.py: max_req_len``) is one line, exit 2; one above max_total_tokens, exit 3."""
    m = own_folder(tmp_path)
    sets = [f"model.host_dir={m}", *NEXTN, "model.draft.path=/models/Qwen3.x-27B-GPTQ-Int4", f"model.draft.host_dir={m}"]
    p = planned(sets + ["runtime.min_total_tokens=2048"], host_ram=15 * GiB, platform="wsl2")
    assert p.verdict == "unsafe"
    assert [r for r in p.reasons if r.startswith("runtime.min_total_tokens: SGLang caps runtime.max_total_tokens "
                                                 "28,672 at 1,410 tokens") and "2,048" in r], p.reasons
    assert planned(sets + ["runtime.min_total_tokens=1410"], host_ram=15 * GiB, platform="wsl2").verdict == "ok"
    r = cli("plan", "-p", PROFILE, "--host-ram", "15GiB", "--set", "runtime.min_total_tokens=1")
    assert r.code == 2 and "Traceback" not in r.err
    assert [ln for ln in r.err.splitlines() if "runtime.min_total_tokens" in ln and "2" in ln]
    r = cli("plan", "-p", PROFILE, "--host-ram", "64GiB", "--set", "runtime.min_total_tokens=30000", "-f", "json")
    assert r.code == 3
    assert [x for x in json.loads(r.out)["reasons"] if x.startswith("runtime.min_total_tokens: 30,000 is above")]


@pytest.mark.parametrize("backend, refused", [("fa4", True), ("torch_native", True), ("fa3", False), ("triton", False)])
def test_a_topk_tree_on_pages_needs_a_backend_that_drafts_one(backend, refused):
    """EAGLE with top-k 4 on the multi-token pages of ``linux-tp2-l3`` and an attention backend the
    profile names: SGLang stops at argument resolution unless it is flashinfer, fa3 or triton
    (``speculative_hook.py: _handle_eagle_family``); the differential fuzz found plan accepting it."""
    sets = ["runtime.speculative={algorithm: EAGLE, num_steps: 2, eagle_topk: 4, num_draft_tokens: 8}",
            f"runtime.attention_backend={backend}", "hicache.enabled=false"]
    prof = load_profile("linux-tp2-l3", sets)
    g = gather(prof, DescribedHost(128 * GiB, "linux"))
    p = decide(prof, g, resolve_runtime(prof, g, ProfileTarget()))
    lines = [r for r in p.reasons if r.startswith(f"runtime.attention_backend: {backend} with runtime.speculative"
                                                  ".eagle_topk 4")]
    assert bool(lines) == refused, p.reasons


def test_the_cap_is_said_by_serve_print_up_dry_run_and_compose(tmp_path):
    """The same cap (NEXTN on the fp8 profile, a 15 GiB WSL2 box described by a facts file, no
    model folder) reaches every command that renders the launch: ``serve --print`` renders the
    capped ``--max-total-tokens``, ``up --dry-run`` that and the warning, ``compose --facts`` says
    it on stderr, and so does ``serve``."""
    from escha_deploy.facts.factsfile import FactsFile, HostSection
    from tests.inproc import run_main
    from tests.pipeline.test_one_launch import _container_checks
    from escha_deploy.runtime.description import RuntimeDescription

    facts = tmp_path / "box.json"
    facts.write_text(FactsFile(host=HostSection(platform="wsl2", mem_total_bytes=15 * GiB)).model_dump_json())
    runtime = tmp_path / "runtime.json"
    runtime.write_text(RuntimeDescription(
        sglang_version="0.5.19", base="image:lmsysorg/sglang:v0.5.19", base_inventory_digest="0" * 64,
        base_inventory_committed=True, python="3.11.2", sglang_dir="/sglang",
        capabilities=list(load_profile(PROFILE).runtime.needs), inventory_digest="0" * 64).model_dump_json())
    sets = [a for s in NEXTN for a in ("--set", s)]
    env = {"XDG_CACHE_HOME": str(tmp_path / "cache"), "DOCKER_HOST": f"unix://{tmp_path}/no-docker.sock"}
    a, b, c = _container_checks(runtime)
    with a, b, c:
        serve = run_main("serve", "--profile", PROFILE, *sets, "--print",
                         env={**env, "ESCHA_SERVE_MODE": "container", "ESCHA_FACTS": str(facts)})
        dry = run_main("up", "--profile", PROFILE, *sets, "--facts", str(facts), "--dry-run", "--format", "json", env=env)
        compose = run_main("compose", "--profile", PROFILE, *sets, "--facts", str(facts), env=env)
    assert serve.code == 0 and compose.code == 0, serve.err + compose.err
    printed, got = json.loads(serve.out), json.loads(dry.out)
    tokens = got["argv"][got["argv"].index("--max-total-tokens") + 1]
    assert int(tokens) < 28_672 and printed["argv"] == got["argv"]
    assert [w for w in got["warnings"] if w.startswith("plan: runtime.max_total_tokens: 28,672 tokens do not fit")
            and f"profiled {int(tokens):,} tokens" in w]
    assert "runtime.max_total_tokens: 28,672 tokens do not fit" in compose.err
    # serve says the cap too, on stderr, with the figure SGLang will use
    assert "plan: runtime.max_total_tokens: 28,672 tokens do not fit" in serve.err
    assert f"profiled {int(tokens):,} tokens" in serve.err


@pytest.mark.parametrize("cc,backend,extra,refused", [
    ("10.0", "fa4", [], True),             # fa4's page forced to 128, then NGRAM's tree of 10
    ("10.0", "flashinfer", [], False),     # the backend SGLang drafts the tree on pages with
    ("10.0", "fa4", ["--speculative-ngram-max-bfs-breadth", "'1'"], False),  # no tree: top-k 1
    ("12.0", "fa4", [], False),            # not sm100: fa4's page stays
])
def test_ngram_with_fa4_on_sm100(cc, backend, extra, refused):
    """NGRAM with fa4 on an sm100 card: SGLang forces fa4's page to 128 tokens
    (``overrides.py: _fa4_page_constraint``), then refuses NGRAM's top-k tree on pages with any
    backend but flashinfer (``speculative_hook.py: _handle_ngram``); the differential fuzz found plan
    accepting it on 0.5.21."""
    sets = ["runtime.speculative={algorithm: NGRAM}", f"runtime.attention_backend={backend}",
            f'hardware.compute_capability="{cc}"', f"runtime.extra_args=[{', '.join(extra)}]", "hicache.enabled=false"]
    prof = load_profile("rtx5060ti-tp2-fp8", sets)
    g = gather(prof, DescribedHost(128 * GiB, "linux"))
    p = decide(prof, g, resolve_runtime(prof, g, ProfileTarget()))
    lines = [r for r in p.reasons if r.startswith("runtime.attention_backend: fa4 with NGRAM")]
    assert bool(lines) == refused, p.reasons


@pytest.mark.parametrize("topk, refused", [(4, True), (1, False)])
def test_trtllm_mha_drafts_only_top_k_1(topk, refused):
    """EAGLE with top-k 4 and ``trtllm_mha`` named by the profile: SGLang refuses at argument
    resolution on any page size (``speculative_hook.py: _handle_eagle_family``, "trtllm_mha backend
    only supports topk = 1 for speculative decoding."); the differential fuzz's speculative draw
    found plan accepting it on the fp8 profile (sm100 card)."""
    spec = (f"{{algorithm: EAGLE, num_steps: 2, eagle_topk: {topk}, num_draft_tokens: 8}}" if topk > 1 else
            "{algorithm: EAGLE, num_steps: 2, eagle_topk: 1, num_draft_tokens: 3}")
    sets = [f"runtime.speculative={spec}", "runtime.attention_backend=trtllm_mha", 'hardware.compute_capability="10.0"']
    prof = load_profile(PROFILE, sets)
    g = gather(prof, DescribedHost(128 * GiB, "linux"))
    p = decide(prof, g, resolve_runtime(prof, g, ProfileTarget()))
    lines = [r for r in p.reasons if r.startswith("runtime.attention_backend: trtllm_mha with runtime.speculative"
                                                  f".eagle_topk {topk}")]
    assert bool(lines) == refused, p.reasons
