"""The all-reduce smoke test with 2 real processes: gloo on the CPU here (CI), NCCL on 2 GPUs
where they exist (the two-GPU issue runs that)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

from escha_deploy.doctor.nccl_smoke import launch  # noqa: E402
from escha_deploy.doctor.probes import nccl_attempts, run_nccl_smoke  # noqa: E402


def test_gloo_all_reduce_two_processes():
    r = launch(2, backend="gloo", timeout_s=30)
    assert r["ok"], r["error"]
    assert [x["sum"] for x in r["ranks"]] == [3.0, 3.0]
    assert {x["rank"] for x in r["ranks"]} == {0, 1}


def test_module_entry_point_runs_and_exits_zero():
    out = subprocess.run([sys.executable, "-m", "escha_deploy.doctor.nccl_smoke", "--backend", "gloo",
                          "--world-size", "3", "--timeout", "30", "--env", "NCCL_P2P_DISABLE=1"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert r["ok"] and r["env"] == {"NCCL_P2P_DISABLE": "1"} and [x["sum"] for x in r["ranks"]] == [6.0] * 3


def test_busy_port_is_reported_not_raised():
    """Rank 0 cannot serve the rendezvous on a port another socket holds: a failure with a
    reason, within the deadline."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        # rank 0 fails after importing torch and torch's TCPStore retrying the bind for the
        # 5 s timeout: about 5.5 s on a quiet machine, 15 s on a loaded CI runner (seen), so the
        # startup grace is wide and the test still ends when rank 0 fails, not at the deadline
        r = launch(2, backend="gloo", timeout_s=5, env={"MASTER_PORT": str(port)}, startup_grace_s=60)
    assert not r["ok"] and not r["hung"]
    # rank 0's own reason comes first; rank 1, which waited for it, was stopped, not timed out
    assert r["error"].startswith("rank 0: "), r["error"]
    assert "EADDRINUSE" in r["error"] or "address already in use" in r["error"], r["error"]
    assert "rank 1 stopped: rank 0 failed" in r["error"], r["error"]
    assert r["seconds"] < 65  # the deadline was 65 s; the wait ended with rank 0


def test_fallback_stops_at_the_first_pass():
    tried = run_nccl_smoke(2, [{"X_FIRST": "1"}, {"X_SECOND": "1"}], backend="gloo", timeout_s=30)
    assert len(tried) == 1 and tried[0]["ok"] and tried[0]["env"] == {"X_FIRST": "1"}


@pytest.mark.parametrize("record, platform, first", [
    ("nvml-2x-rtx4090.json", "linux", {"NCCL_P2P_DISABLE": "1"}),  # NVML: GeForce, P2P not supported
    ("nvml-2x-h200-p2p.json", "wsl2", {"NCCL_P2P_DISABLE": "1"}),
    ("nvml-2x-h200-p2p.json", "linux", {}),
    (None, "linux", {}),  # no NVML facts: NCCL detects P2P itself, P2P off is the fallback
])
def test_attempt_order(record, platform, first):
    from nvml_replay import recorded_inventory

    attempts = nccl_attempts(recorded_inventory(record) if record else None, platform)
    assert attempts[0] == first and len(attempts) == 2
    assert attempts[1].get("NCCL_P2P_DISABLE") == "1"


@pytest.mark.gpu
def test_nccl_two_gpus():
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 CUDA devices")
    r = launch(2, backend="nccl", timeout_s=60, env={"NCCL_P2P_DISABLE": "1"})
    assert r["ok"], r["error"]
