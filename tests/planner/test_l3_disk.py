"""The file L3 store's disk, as SGLang keeps it: its cap holds per rank (each rank's
``LRUFileEvictor`` in ``srt/mem_cache/storage/file/lru_file_evictor.py`` owns the files suffixed
``_{tp_rank}_{tp_size}`` by ``HiCacheFile``, ``srt/mem_cache/hicache_storage.py``; TP rank 0
alone for an MLA model), and a store reused across a restart is counted, never to be deleted.
Real folders; a store's files are sparse files (their size is what SGLang's scan counts,
``os.stat``, and they take no room, so this filesystem's free space stays as it is)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from escha_deploy.facts.folders import check_l3_dir, read_l3_dir
from escha_deploy.facts.machine import described_host
from escha_deploy.planner import plan
from escha_deploy.profile import load_profile
from escha_deploy.sglang.arch import ModelDirFacts, read_model_dir
from escha_deploy.sglang.filestore import owners

GB = 10**9
L3 = "linux-tp2-l3"


def _profile(**l3):
    p = load_profile(L3)
    return p.model_copy(update={"hicache": p.hicache.model_copy(
        update={"l3": p.hicache.l3.model_copy(update=l3)})})


def test_at_tp2_the_need_is_two_caps():
    p = plan(load_profile(L3), described_host(128 * 2**30))
    d = p.l3_disk
    assert d is not None and (d.cap_per_rank_bytes, d.owner_ranks, d.min_free_bytes) == (512 * GB, 2, 0)
    assert d.need_bytes == 1024 * GB
    # the watermark SGLang keeps free is part of the need, and is rendered to SGLang's variable
    p2 = plan(_profile(min_free_space=20 * GB), described_host(128 * 2**30))
    assert p2.l3_disk.need_bytes == 1044 * GB


def test_an_mla_model_needs_one_ranks_cap(tmp_path):
    # a DeepSeek-V3 config.json: SGLang keeps its KV rank-replicated (model_config.py: AttentionArch.MLA)
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["DeepseekV3ForCausalLM"],
                                                      "kv_lora_rank": 512}))
    assert owners("0.5.19", 2, mla=True, hybrid=False).ranks == 1
    assert owners("0.5.23", 2, mla=True, hybrid=True).ranks == 2  # its mamba state is TP-sharded there
    assert owners("0.5.19", 4, mla=False, hybrid=True).ranks == 4
    folder = ModelDirFacts(path=str(tmp_path), kv_rank_replicated=True)
    p = plan(load_profile(L3), described_host(128 * 2**30), model_dir=folder)
    assert (p.l3_disk.owner_ranks, p.l3_disk.need_bytes) == (1, 512 * GB)
    from escha_deploy.sglang.filestore import rank_replicated

    assert rank_replicated(json.loads((tmp_path / "config.json").read_text()))
    assert not rank_replicated({"architectures": ["Qwen3_5ForConditionalGeneration"]})


def _free(p: Path) -> int:
    st = os.statvfs(p)
    return st.f_bavail * st.f_frsize


def _sparse(path: Path, size: int) -> None:
    with open(path, "wb") as f:
        f.truncate(size)


def test_a_store_holding_files_restarts_ok_where_free_plus_its_files_cover_the_need(tmp_path, cli):
    store = tmp_path / "l3"
    store.mkdir()
    # the files a TP2 server of this model left: each rank's own, and one of a TP1 run (no rank's)
    for name, size in (("a1b2_qwen_0_2.bin", 2 * GB), ("a1b2_qwen_1_2.bin", 2 * GB), ("c3d4_qwen_0_1.bin", 5 * GB),
                       ("notes.txt", 10)):
        _sparse(store / name, size)
    _, reading = read_l3_dir(str(store), tp_size=2, mla=False)
    assert reading is not None and (reading.store_bytes, reading.store_files, reading.other_bytes) == (4 * GB, 2, 5 * GB)
    # each rank's cap: half of (free + the store's 4 GB) less 1 GB of slack for whatever else
    # writes to this filesystem meanwhile: the free space alone is 2 GB short of the need
    cap = (_free(store) + 4 * GB) // 2 - GB // 2
    sets = ["--hicache-size", "3", "--set", f"hicache.l3.dir={store}", "--set", f"hicache.l3.max_size={cap}B"]
    r = cli("plan", "-p", L3, *sets, "-f", "json")
    assert r.code == 0, r.out + r.err
    d = json.loads(r.out)
    assert d["verdict"] != "unsafe" and d["l3_disk"]["reading"]["store_bytes"] == 4 * GB
    assert d["l3_disk"]["need_bytes"] == 2 * cap
    # the same store emptied of this server's files: the free space alone does not cover the need
    for name in ("a1b2_qwen_0_2.bin", "a1b2_qwen_1_2.bin"):
        (store / name).unlink()
    r = cli("plan", "-p", L3, *sets)
    said = " ".join(r.out.split())
    assert r.code == 3 and f"hicache.l3.dir: {store} has" in said and "in this store's own files" in said
    assert "of other .bin files there belong to no rank of this server" in said
    assert "lower hicache.l3.max_size to" in said and "delete" not in said and "free space there" not in said
    assert sorted(x.name for x in store.iterdir()) == ["c3d4_qwen_0_1.bin", "notes.txt"]  # nothing removed


def test_bad_disk_input_is_one_line_naming_the_key(tmp_path, cli):
    a_file = tmp_path / "file"
    a_file.write_text("x")
    assert check_l3_dir(str(a_file), GB) == [f"hicache.l3.dir: {a_file} is not a folder"]
    store = tmp_path / "l3"
    store.mkdir()
    st = os.statvfs(store)
    fs = st.f_blocks * st.f_frsize
    # a watermark above the disk
    [line] = check_l3_dir(str(store), GB, tp_size=2, ranks=2, min_free=fs + GB)
    assert line.startswith("hicache.l3.min_free_space: ") and "not less than the whole filesystem" in line
    # a need larger than the filesystem: SGLang would clamp each rank's cap, the ranks together fill it
    [line] = check_l3_dir(str(store), fs, tp_size=2, ranks=2)
    assert line.startswith("hicache.l3.max_size: the tier needs ") and "more than the whole filesystem" in line
    # a cap of 0 is SGLang's "no cap" (lru_file_evictor.py: _parse_size_to_bytes): refused as bad input
    r = cli("plan", "-p", L3, "--host-ram", "128GiB", "--set", "hicache.l3.max_size=0B")
    assert r.code == 2 and "hicache.l3.max_size" in r.err and "Traceback" not in r.err
    # a cap below one page's file: SGLang stores nothing
    r = cli("plan", "-p", L3, "--host-ram", "128GiB", "--set", "hicache.l3.max_size=1MB", "-f", "json")
    assert r.code == 3 and any(x.startswith("hicache.l3.max_size: 1,000,000 B per rank is less than one page")
                               for x in json.loads(r.out)["reasons"])
    # a store whose files cannot be listed (a folder this user may write but not read)
    if os.geteuid() != 0:
        store.chmod(0o300)
        try:
            problems, _ = read_l3_dir(str(store), tp_size=2, mla=False)
            assert len(problems) == 1 and "cannot read the store's files" in problems[0]
        finally:
            store.chmod(0o700)


def test_the_watermark_is_rendered_to_sglangs_variable():
    from escha_deploy.pipeline.argv import server_env

    prof = _profile(min_free_space=20 * GB)
    env = server_env(plan(prof, described_host(128 * 2**30)), prof)
    assert env["SGLANG_HICACHE_FILE_BACKEND_MIN_FREE_SPACE"] == str(20 * GB)  # srt/environ.py, an EnvStr
    assert env["SGLANG_HICACHE_FILE_BACKEND_MAX_SIZE"] == str(512 * GB)
    assert "SGLANG_HICACHE_FILE_BACKEND_MIN_FREE_SPACE" not in server_env(plan(load_profile(L3), described_host(
        128 * 2**30)), load_profile(L3))


def test_a_model_folder_says_whether_its_kv_is_rank_replicated(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({
        "architectures": ["Qwen3_5ForConditionalGeneration"], "model_type": "qwen3_5",
        "text_config": {"model_type": "qwen3_5_text", "num_hidden_layers": 4, "num_key_value_heads": 4,
                        "head_dim": 64, "full_attention_interval": 4, "linear_num_key_heads": 4,
                        "linear_num_value_heads": 8, "linear_key_head_dim": 32, "linear_value_head_dim": 32,
                        "linear_conv_kernel_dim": 4, "hidden_size": 256, "num_attention_heads": 8},
        "vision_config": {"depth": 2}}))
    facts = read_model_dir(tmp_path)
    assert facts is not None and not facts.kv_rank_replicated and facts.text_subconfig
    assert facts.architectures == ("Qwen3_5ForConditionalGeneration",)


def test_a_large_store_scan_says_how_far_it_got_and_an_unreadable_one_is_one_line(tmp_path, monkeypatch):
    store = tmp_path / "l3"
    store.mkdir()
    for i in range(2048):
        (store / f"k{i}_m_{i % 2}_2.bin").write_bytes(b"\0")
    ticks = iter(range(10**6))  # a clock one second a call: every check finds the interval passed
    said: list[str] = []
    _, reading = read_l3_dir(str(store), tp_size=2, mla=False, progress=said.append, clock=lambda: next(ticks))
    assert reading is not None and reading.store_files == 2048 and reading.store_bytes == 2048
    assert said == [f"hicache.l3.dir: scanning {store}: 2,048 entries so far, 0.00 GB in this store's own 2,047 files"]
    # a listing that fails (fault injected: root reads any folder) is one line naming the key
    import escha_deploy.facts.folders as folders

    def denied(_path):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(folders.os, "scandir", denied)
    problems, reading = read_l3_dir(str(store), tp_size=2, mla=False)
    assert reading is None and problems == [
        f"hicache.l3.dir: {store}: cannot read the store's files (Permission denied); SGLang counts them at start "
        "(lru_file_evictor.py: _scan_existing_files): let the server's user list and read the folder"]
