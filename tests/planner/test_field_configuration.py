"""The second field report's configuration, shipped as ``rtx5090-tp2-mtp3-l3`` on the box of
``profiles/boxes/rtx5090x2-128g.json`` (2 x 32 GB cards, 128 GB of RAM): planned from that facts
file and rendered, as a user runs it."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
PROFILE = "rtx5090-tp2-mtp3-l3"
BOX = ROOT / "profiles" / "boxes" / "rtx5090x2-128g.json"
GB = 10**9


def _flag(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def test_the_field_configuration_plans_on_its_box(cli):
    r = cli("plan", "-p", PROFILE, "--facts", str(BOX), "-f", "json")
    assert r.code == 0, r.err
    p = json.loads(r.out)
    assert p["verdict"] == "ok" and p["tp_size"] == 2 and p["hicache"]["size_gb"] == 30
    assert 59 * GB < p["pinned_total_bytes"] < 61 * GB  # about 60 GB of host tier in all
    # the file L3 cap holds per rank: 512 GB at TP2 is 1,024 GB of disk
    assert (p["l3_disk"]["cap_per_rank_bytes"], p["l3_disk"]["owner_ranks"], p["l3_disk"]["need_bytes"]) == (
        512 * GB, 2, 1024 * GB)
    # 64 slots, capped by the mamba slots SGLang sizes: said, not refused
    assert any(w.startswith("runtime.max_running_requests: 64 requests but") for w in p["warnings"])


def test_the_field_configuration_renders(cli, tmp_path):
    r = cli("compose", "-p", PROFILE, "--facts", str(BOX), "-o", str(tmp_path / "compose.yaml"))
    assert r.code == 0, r.err
    svc = yaml.safe_load((tmp_path / "compose.yaml").read_text())["services"]["sglang"]
    assert svc["deploy"]["resources"]["reservations"]["devices"][0]["count"] == 2
    # the server here, its L3 folder a real one: a disk short of 1,024 GB is refused, naming the key
    s = cli("serve", "-p", PROFILE, "--facts", str(BOX), "--set", "runtime.needs=[]",
            "--set", f"hicache.l3.dir={tmp_path}", "--print")
    launch = json.loads(s.out)
    assert (s.code, launch["refusals"][:1]) in ((0, []), (3, [launch["refusals"][0]]))
    if s.code == 3:
        assert launch["refusals"][0].startswith("plan: hicache.l3.max_size: the tier needs 1024.00 GB "
                                                "(hicache.l3.max_size 512.00 GB per rank x 2 ranks)")
    argv, env = launch["argv"], launch["env"]
    assert (_flag(argv, "--tp-size"), _flag(argv, "--speculative-algorithm"), _flag(argv, "--speculative-num-steps"),
            _flag(argv, "--max-running-requests"), _flag(argv, "--context-length")) == ("2", "NEXTN", "3", "64", "524288")
    assert "--disable-prefill-cuda-graph" in argv and _flag(argv, "--hicache-storage-backend") == "file"
    assert env["SGLANG_HICACHE_FILE_BACKEND_MAX_SIZE"] == str(512 * GB)
    assert env["SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN"] == "1"
