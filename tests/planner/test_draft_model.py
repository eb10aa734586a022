"""The speculative-decoding draft in the device budget (``model.draft``, ``planner.draft``).

Real parts: model and draft folders generated here with a config.json and safetensors files of
known size (sparse files; the MTP case writes a real safetensors header), read by the same
pipeline ``plan`` uses (``pipeline.gather``), planned by ``pipeline.decide``. The expected
figures are computed in the test from SGLang 0.5.19's formulas (``planner/draft.py`` cites
them): the draft's weights per rank are its safetensors / tp and come out of the static budget
before the KV pool (``kv_cache_configurator.py: _profile_available_bytes``), and the target's
cell per token is ``int(cell * (1 + draft layers / KV layers))`` (``pool_configurator.py:
DefaultPoolConfigurator.__init__``).
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from escha_deploy.utils.errors import BadInput
from escha_deploy.pipeline import DescribedHost, ProfileTarget, decide, gather, resolve_runtime
from escha_deploy.profile import load_profile, profile_to_data

GiB, MiB = 2**30, 2**20
PROFILE = "rtx5060ti-tp2-fp8"  # 2 x 12 GiB, TP 2, fp8 KV, mem_fraction_static 0.825
EAGLE3 = "runtime.speculative.algorithm=EAGLE3"
DENSE = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "num_hidden_layers": 64,
         "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 128, "hidden_size": 5120,
         "max_position_embeddings": 40960}
EAGLE3_DRAFT = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "num_hidden_layers": 1,
                "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 128, "hidden_size": 5120}


def folder(root: Path, name: str, config: dict, weights: int) -> Path:
    d = root / name
    d.mkdir()
    (d / "config.json").write_text(json.dumps(config))
    with open(d / "model.safetensors", "wb") as fh:
        fh.truncate(weights)  # a sparse file of exactly this many bytes
    return d


def planned(sets: list[str], *, host_ram: int = 64 * GiB):
    prof = load_profile(PROFILE, sets)
    g = gather(prof, DescribedHost(host_ram, "linux"))
    return g, decide(prof, g, resolve_runtime(prof, g, ProfileTarget()))


def static_budget() -> int:
    """(12 GiB VRAM - 512 MiB CUDA context) x 0.825, the profile's fraction (planner's formula)."""
    return int((12 * GiB - 512 * MiB) * 0.825)


def test_the_draft_weights_and_kv_come_out_of_the_budget_exactly(tmp_path):
    model = folder(tmp_path, "m", DENSE, 8 * 10**9)
    draft = folder(tmp_path, "d", EAGLE3_DRAFT, 10**9)
    base = [f"model.host_dir={model}", "runtime.max_total_tokens=null", EAGLE3]
    _, without = planned(base)
    _, with_draft = planned(base + ["model.draft.path=/drafts/e3", f"model.draft.host_dir={draft}"])

    cell = 64 * 2 * (8 // 2) * 128 * 1  # layers x K,V x KV heads per rank x head_dim x fp8 = 65,536 B
    w, dw = 8 * 10**9 // 2, 10**9 // 2
    r0 = without.per_rank
    assert (r0.device_kv_bytes_per_token, r0.draft_weights_bytes, r0.device_draft_kv_bytes) == (cell, 0, 0)
    assert r0.device_kv_tokens == (static_budget() - w) // cell == 94_408
    assert any("are not in this plan" in f.message for f in without.findings)

    scaled = int(cell * (1 + 1 / 64))  # SGLang's scaled cell: 66,560 B
    assert scaled == 66_560
    r = with_draft.per_rank
    tokens = (static_budget() - w - dw) // scaled
    assert (r.weights_bytes, r.draft_weights_bytes) == (w, dw)
    assert (r.device_kv_bytes_per_token, r.draft_kv_bytes_per_token) == (cell, scaled - cell)
    assert r.device_kv_tokens == tokens == 85_443
    assert r.device_kv_bytes == (tokens + 1) * cell and r.device_draft_kv_bytes == (tokens + 1) * (scaled - cell)
    assert with_draft.device.static_need_bytes == w + dw + (tokens + 1) * scaled
    assert with_draft.device.fits and with_draft.verdict != "unsafe"
    assert r0.device_kv_tokens > tokens  # the draft costs the target tokens
    # the device lines name their SGLang source; the plan says nothing is left uncounted
    rules = {d.rule: d.reason for d in with_draft.decisions}
    assert "_profile_available_bytes" in rules["draft weights per rank"]
    assert "pool_configurator.py: DefaultPoolConfigurator.__init__" in rules["draft KV per token"]
    assert "_resolve_eagle_aux_hidden_state" in rules["draft KV per token"]
    assert "KVCacheConfigurator.configure" in rules["draft KV pool per rank"]
    assert not any("not counted" in f.message or "not in this plan" in f.message for f in with_draft.findings)


def test_a_draft_that_does_not_fit_is_refused(tmp_path):
    model = folder(tmp_path, "m", DENSE, 8 * 10**9)
    draft = folder(tmp_path, "d", {**EAGLE3_DRAFT, "num_hidden_layers": 2}, 14 * 10**9)  # 7 GB per rank
    base = [f"model.host_dir={model}", EAGLE3]  # the profile's max_total_tokens: 28,672
    _, alone = planned(base)
    assert alone.device.fits
    _, both = planned(base + ["model.draft.path=/drafts/big", f"model.draft.host_dir={draft}"])
    assert not both.device.fits and both.verdict == "unsafe"
    line = next(x for x in both.reasons if x.startswith("device: weights"))
    assert "draft weights 7.00 GB" in line and "_profile_available_bytes" in line


def test_nextn_on_the_models_own_mtp_layers(tmp_path):
    """The draft in the model's own folder: its weights are the tensors named ``mtp`` (read from the
    safetensors header), which the target does not load; one draft layer over the 16 KV layers."""
    from tests.oracle.cases import config_json

    arch = load_profile(PROFILE).model.architecture
    m = tmp_path / "m"
    m.mkdir()
    (m / "config.json").write_text(json.dumps(config_json(arch)))
    mtp, rest = 6 * 10**8, 10**9
    header = json.dumps({"mtp.fc.weight": {"dtype": "BF16", "shape": [mtp // 2], "data_offsets": [0, mtp]},
                         "model.embed_tokens.weight": {"dtype": "BF16", "shape": [rest // 2],
                                                       "data_offsets": [mtp, mtp + rest]}}).encode()
    with open(m / "model.safetensors", "wb") as fh:
        fh.write(struct.pack("<Q", len(header)) + header)
        fh.truncate(8 + len(header) + mtp + rest)
    total = 8 + len(header) + mtp + rest
    sets = [f"model.host_dir={m}", "runtime.speculative.algorithm=NEXTN",
            "runtime.mamba_radix_cache_strategy=extra_buffer_lazy"]
    _, none = planned(sets)
    g, p = planned(sets + ["model.draft.path=/models/Qwen3.x-27B-GPTQ-Int4", f"model.draft.host_dir={m}"])
    assert g.draft is not None and g.draft.own_folder and g.draft.weights_bytes == mtp and g.draft.num_layers == 1
    r = p.per_rank
    # the target's weights are the headers' tensor bytes less the MTP tensors, draft or not: SGLang's
    # target never loads them (qwen3_5.py: load_weights skips "mtp" names; qwen3_next.py: unless is_mtp)
    assert (r.weights_bytes, r.draft_weights_bytes) == (rest // 2, mtp // 2)
    assert total > mtp + rest  # the file sizes (header included) no longer feed the budget
    cell = r.device_kv_bytes_per_token
    assert r.draft_kv_bytes_per_token == int(cell * (1 + 1 / 16)) - cell  # 1 MTP layer over 16 full-attention layers
    assert r.device_draft_kv_bytes == (28_672 + 1) * r.draft_kv_bytes_per_token
    assert none.per_rank.weights_bytes == rest // 2 and not none.per_rank.draft_kv_bytes_per_token
    assert any("without a draft path SGLang sizes no KV" in f.message for f in none.findings)
    # the intermediate mamba states SGLang keeps per draft token are counted on the device: SGLang's
    # default draft for NEXTN is 4 tokens (3 steps, top-k 1), for min(2 requests, 10 slots // 4 per
    # request with extra_buffer_lazy) + 1 (kv_cache_configurator.py: _handle_max_mamba_cache)
    per_slot = r.mamba_bytes_per_slot
    assert per_slot == 39_223_296
    assert r.device_mamba_intermediate_bytes == per_slot * (2 + 1) * 4 == 470_679_552
    assert p.device.static_need_bytes >= r.device_mamba_intermediate_bytes + r.device_mamba_bytes
    assert not any("_handle_max_mamba_cache" in f.message for f in p.findings)  # counted, so no warning


def test_without_a_folder_here_the_plan_says_the_draft_is_not_counted(tmp_path):
    _, p = planned([EAGLE3, "model.draft.path=/drafts/e3", f"model.draft.host_dir={tmp_path / 'absent'}"])
    assert p.per_rank.draft_weights_bytes == 0 and p.per_rank.draft_kv_bytes_per_token == 0
    line = next(f for f in p.findings if f.field == "model.draft")
    assert "not counted" in line.message and str(tmp_path / "absent") in line.message


def test_a_draft_without_a_speculative_algorithm_is_an_inert_key(tmp_path):
    draft = folder(tmp_path, "d", EAGLE3_DRAFT, 10**9)
    _, p = planned(["model.draft.path=/drafts/e3", f"model.draft.host_dir={draft}"])
    assert p.per_rank.draft_weights_bytes == 0
    assert any(f.field == "model.draft" and "no runtime.speculative.algorithm" in f.message for f in p.findings)


def test_a_bad_safetensors_header_in_the_models_own_folder_names_the_key(tmp_path):
    m = folder(tmp_path, "m", DENSE, 4)  # 4 bytes: no 8-byte header length
    with pytest.raises(BadInput, match="^model.draft.host_dir: .*model.safetensors: not a safetensors file"):
        planned([f"model.host_dir={m}", EAGLE3, "model.draft.path=/models/x", f"model.draft.host_dir={m}"])


NEXTN = ["model.path=/models/Qwen3.x-27B-FP8",
         "runtime.speculative={algorithm: NEXTN, num_steps: 1, eagle_topk: 1, num_draft_tokens: 2}"]


def _own_folder(tmp_path: Path, header: dict | bytes, data: int = 0, length: int | None = None) -> Path:
    """The model's folder, also its NEXTN draft: the profile's architecture as config.json and one
    safetensors file with ``header`` (or raw header bytes), its stated ``length`` (default: the
    header's), then ``data`` bytes."""
    from tests.oracle.cases import config_json

    m = tmp_path / "m"
    m.mkdir()
    (m / "config.json").write_text(json.dumps(config_json(load_profile(PROFILE).model.architecture)))
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    with open(m / "model.safetensors", "wb") as fh:
        fh.write(struct.pack("<Q", len(raw) if length is None else length) + raw)
        fh.truncate(8 + len(raw) + data)
    return m


#: A file shorter than its header says: the model folder's own check refuses it first (exit 3,
#: ``folders.shard_problems``), as the same folder is the draft's.
SHORT = "its header needs (a partial download or copy?)"


@pytest.mark.parametrize("header, data, length, fragment", [
    # an MTP tensor claiming 1 PB in a 60-byte file: it was planned as weights -500000.00 GB, verdict ok
    ({"mtp.w": {"dtype": "BF16", "shape": [1], "data_offsets": [0, 10**15]}}, 0, None,
     SHORT),
    # a tensor the draft does not count is checked too
    ({"mtp.w": {"dtype": "BF16", "shape": [1], "data_offsets": [0, 2]},
      "model.w": {"dtype": "BF16", "shape": [4], "data_offsets": [2, 10]}}, 4, None,
     SHORT),
    ({"mtp.w": {"dtype": "BF16", "shape": [1000], "data_offsets": [0, 2]}}, 2, None,
     "tensor 'mtp.w' holds 2 bytes but BF16 x [1000] is 2,000"),
    ({"mtp.w": {"dtype": "Q2", "shape": [1], "data_offsets": [0, 2]}}, 2, None,
     "tensor 'mtp.w' has dtype 'Q2', not a safetensors dtype"),
    ({"mtp.w": {"dtype": "BF16", "shape": [-1], "data_offsets": [0, 2]}}, 2, None,
     "tensor 'mtp.w' has no valid shape"),
    ({"mtp.w": {"dtype": "BF16", "shape": [True], "data_offsets": [0, 2]}}, 2, None,
     "tensor 'mtp.w' has no valid shape"),
    # a header length past the end of the file: it was read as whatever the file held
    (b"{}" + b" " * 190, 0, 50_000_000,
     SHORT),
])
def test_a_header_that_does_not_fit_its_file_is_refused(tmp_path, cli, header, data, length, fragment):
    m = _own_folder(tmp_path, header, data, length)
    r = cli("plan", "-p", PROFILE, "--host-ram", "64GiB", "--linux", "--set", f"model.host_dir={m}",
            "--set", f"model.draft={{path: /models/Qwen3.x-27B-FP8, host_dir: {m}}}",
            *(a for s in NEXTN for a in ("--set", s)))
    assert r.code == (3 if fragment == SHORT else 2), r.out + r.err
    key = "model.host_dir" if fragment == SHORT else "model.draft.host_dir"
    errors = [ln for ln in r.err.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith(f"error: {key}: {m}/model.safetensors: ")
    assert fragment in errors[0], errors[0]
    assert "Traceback" not in r.err and not r.out


def test_sub_byte_dtypes_count_their_bits(tmp_path):
    """F4 packs two elements in a byte (safetensors ``Dtype::bitsize``): 4 elements, 2 bytes."""
    from escha_deploy.sglang.arch import safetensors_tensor_bytes

    m = _own_folder(tmp_path, {"mtp.w": {"dtype": "F4", "shape": [2, 2], "data_offsets": [0, 2]},
                               "__metadata__": {"format": "pt"}}, 2)
    assert safetensors_tensor_bytes(m / "model.safetensors", "mtp") == 2


def test_the_flag_in_extra_args_is_refused_as_the_keys(cli):
    r = cli("plan", "-p", PROFILE, "--host-ram", "64GiB", "--set",
            EAGLE3, "--set", 'runtime.extra_args=["--speculative-draft-model-path", "/d"]')
    assert r.code == 2
    assert "--speculative-draft-model-path is the flag of the profile key model.draft.path" in r.err


def test_the_draft_is_rendered_and_mounted(tmp_path, cli, monkeypatch):
    from escha_deploy.pipeline.spec import build_launch_spec

    draft = folder(tmp_path, "d", EAGLE3_DRAFT, 10**9)
    sets = [EAGLE3, "model.draft.path=/drafts/e3", f"model.draft.host_dir={draft}"]
    prof = load_profile(PROFILE, sets)
    g, p = planned(sets)
    spec = build_launch_spec(p, prof)
    i = spec.argv.index("--speculative-draft-model-path")
    assert spec.argv[i + 1] == "/drafts/e3"
    assert [(m.source, m.target, m.read_only) for m in spec.container.mounts if m.target == "/drafts/e3"] == \
        [(str(draft), "/drafts/e3", True)]
    assert spec.preflight.weights_bytes == p.per_rank.weights_bytes + 10**9 // 2  # both loaded before the pools
    native = build_launch_spec(p, prof, native=True)
    assert native.argv[native.argv.index("--speculative-draft-model-path") + 1] == str(draft)
    # a draft in the model's own folder is not mounted twice
    own = load_profile(PROFILE, [EAGLE3, "model.draft.path=/models/Qwen3.x-27B-GPTQ-Int4",
                                 "model.draft.host_dir=/srv/models/Qwen3.x-27B-GPTQ-Int4"])
    assert [m.target for m in build_launch_spec(p, own).container.mounts].count("/models/Qwen3.x-27B-GPTQ-Int4") == 1
    # compose renders the same mount, read-only
    out = cli("compose", "-p", PROFILE, *(a for s in sets for a in ("--set", s)))
    assert out.code == 0, out.err
    import yaml

    vols = next(iter(yaml.safe_load(out.out)["services"].values()))["volumes"]
    assert {"type": "bind", "source": str(draft), "target": "/drafts/e3", "read_only": True} in vols


def test_profile_key_round_trips_and_leaves_unset_profiles_digest_alone():
    from escha_deploy.pipeline.spec import facts_from_plan, launch_digest

    prof = load_profile(PROFILE, ["model.draft.path=/drafts/e3", "model.draft.host_dir=/srv/drafts/e3"])
    data = profile_to_data(prof)
    assert data["model"]["draft"] == {"path": "/drafts/e3", "host_dir": "/srv/drafts/e3"}
    assert load_profile(PROFILE, [f"model.draft={json.dumps(data['model']['draft'])}"]) == prof
    # unset, the key is not in the profile's data, so neither in the digest nor in a rendered
    # profile (the golden serve.json digests and k8s ConfigMaps stay as they were)
    _, p = planned([])
    plain = profile_to_data(load_profile(PROFILE))
    assert "draft" not in plain["model"] and load_profile(PROFILE, []) == load_profile(PROFILE)
    facts = facts_from_plan(p)
    assert launch_digest(data, facts, ["a"], {}) != launch_digest(plain, facts, ["a"], {})
    with pytest.raises(BadInput, match="model.draft.path"):
        load_profile(PROFILE, ['model.draft.path=" /drafts/e3"'])


def test_the_scaled_cell_rounds_as_each_release_does():
    """0.5.19 rounds the scaled cell once, 0.5.23 the draft's share on its own (their
    pool_configurator.py: DefaultPoolConfigurator.__init__), as each release's facts.yaml
    (``draft_kv_cell``) says; the float rounding is kept."""
    from escha_deploy.planner.draft import scaled_cell
    from escha_deploy.sglang.releases import load_release

    old, new = (load_release(v).draft_kv_cell.rounding for v in ("0.5.19", "0.5.23"))
    assert (old, new) == ("whole", "draft_share")
    assert scaled_cell(1000, 3, 1, old) == int(1000 * (1 + 1 / 3)) == 1333
    assert scaled_cell(1000, 3, 1, new) == 1000 + int(1000 * 1 / 3) == 1333
    assert scaled_cell(65_537, 16, 1, old) == int(65_537 * (1 + 1 / 16)) == 69_633
    assert scaled_cell(65_537, 16, 1, new) == 65_537 + 65_537 // 16 == 69_633
    # 9 x (1 + 2/3) is 14.999... in floating point: 14 on 0.5.19, 9 + int(6.0) = 15 on 0.5.23
    assert scaled_cell(9, 3, 2, old) == int(9 * (1 + 2 / 3)) == 14
    assert scaled_cell(9, 3, 2, new) == 9 + int(9 * 2 / 3) == 15
    assert scaled_cell(65_536, 64, 0) == scaled_cell(65_536, 0, 1) == 65_536


def test_sglangs_sizing_stages_get_the_draft_weights_too(tmp_path):
    """The figures native ``serve`` and ``up``'s check give SGLang's sizing stages
    (``sglang_preflight.device_figures``) are the launch spec's (``preflight_from_plan``): the
    draft's weights are resident before the KV pool is sized (``_profile_available_bytes``)."""
    from escha_deploy.launch.sglang_preflight import device_figures
    from escha_deploy.pipeline.spec import preflight_from_plan

    model = folder(tmp_path, "m", DENSE, 8 * 10**9)
    draft = folder(tmp_path, "d", EAGLE3_DRAFT, 10**9)
    _, p = planned([f"model.host_dir={model}", "runtime.max_total_tokens=null", EAGLE3,
                    "model.draft.path=/drafts/e3", f"model.draft.host_dir={draft}"])
    figures = device_figures(p)
    assert figures["weights"] == 8 * 10**9 // 2 + 10**9 // 2 == preflight_from_plan(p).weights_bytes
    assert figures["free_before_weights"] == p.device.free_before_weights_bytes and "host_budget" not in figures
    assert device_figures(p, 5 * GiB)["host_budget"] == 5 * GiB
