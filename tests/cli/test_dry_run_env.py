"""``up --dry-run`` shows the server's environment as ``serve --print`` does: both say they show
what would run. A WSL2 box's facts (the golden Linux box, platform wsl2) so the environment
carries NCCL_P2P_DISABLE besides the host reserve and allocator variables."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1]))
from inproc import run_main  # noqa: E402

GOLDEN = Path(__file__).parents[1] / "golden" / "rtx5060ti-tp2-fp8" / "box.json"
P = "rtx5060ti-tp2-fp8"


def test_up_dry_run_shows_the_environment_serve_print_shows(tmp_path):
    facts = json.loads(GOLDEN.read_text())
    facts["host"]["platform"] = "wsl2"
    path = tmp_path / "wsl2.json"
    path.write_text(json.dumps(facts))
    env = {"XDG_CACHE_HOME": str(tmp_path / "cache")}
    dry = run_main("up", "--dry-run", "-p", P, "--facts", str(path), "--format", "json", env=env)
    served = run_main("serve", "--profile", P, "--print",
                      env={**env, "ESCHA_SERVE_MODE": "container", "ESCHA_FACTS": str(path)})
    up_data, serve_data = json.loads(dry.out), json.loads(served.out)
    assert up_data["plan_digest"] == serve_data["plan_digest"]  # the same plan
    assert up_data["env"] == serve_data["env"]
    assert serve_data["env"]["NCCL_P2P_DISABLE"] == "1" and "ESCHA_HICACHE_HOST_RESERVE_BYTES" in serve_data["env"]
    table = run_main("up", "--dry-run", "-p", P, "--facts", str(path), env=env).out
    section = table.split("# server environment", 1)[1].split("\n# ", 1)[0]
    assert "NCCL_P2P_DISABLE=1" in section and "ESCHA_HICACHE_HOST_ALLOCATOR=" in section
