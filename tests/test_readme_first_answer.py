"""README.md's path from nothing to a first answer, followed as written by a fresh copy of the
repository against the hub STAND-IN on 127.0.0.1 (tests/checkpoint/hub_standin.py; never the
internet): `model pull` of the profile's checkpoint (a small one, served under the profile's
repository id), `model verify`, `plan` with the weights measured from the safetensors headers
and pinned, and `up --dry-run`'s first request. The lines that need Docker and GPUs (`docker
pull`, the wheelhouse, `build`, `up --detach`, `ask`) are left out. The README's own note says
how to use another folder: `--set model.host_dir=DIR` on each command, and DIR for `verify`.
README's two set-up commands at its top stay as they are."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from checkpoint.conftest import checkpoint
from checkpoint.hub_standin import HubStandin

REPO_ROOT = Path(__file__).resolve().parents[1]
SETUP = """python3 -m venv .venv && .venv/bin/pip install . && .venv/bin/escha-deploy plan --profile rtx5060ti-tp2
#    then `. .venv/bin/activate` puts escha-deploy on PATH for the commands below
#    (Debian without ensurepip: `apt install python3-venv` first)

# 2. Install everything the tests need (venv, SGLang wheel, Docker) and run them (CI runs this):
bash .ci/test"""


def _block(readme: str) -> list[str]:
    m = re.search(r"<!-- first-answer:.*?-->\n```bash\n(.*?)```\n<!-- /first-answer -->", readme, re.S)
    assert m, "README.md lost its first-answer block"
    return [ln.split("  #")[0].split(" # ")[0].strip() for ln in m.group(1).splitlines()
            if ln.strip() and not ln.lstrip().startswith("#")]


def test_readme_setup_commands_are_unchanged():
    assert SETUP in (REPO_ROOT / "README.md").read_text()


def test_fresh_clone_follows_readme_to_the_first_request(tmp_path):
    from escha_deploy.profile import load_profile

    clone = tmp_path / "clone"
    for part in ("escha_deploy", "profiles", "README.md", "pyproject.toml"):
        src = REPO_ROOT / part
        (shutil.copytree if src.is_dir() else shutil.copy)(src, clone / part)
    lines = _block((clone / "README.md").read_text())
    assert lines[:3] == ["escha-deploy model pull rtx5060ti-tp2-fp8",
                         "escha-deploy model verify /srv/models/Qwen3.x-27B-GPTQ-Int4",
                         "escha-deploy plan -p rtx5060ti-tp2-fp8"], lines
    prof = load_profile("rtx5060ti-tp2-fp8")
    hub = HubStandin()
    commit = hub.add(prof.model.checkpoint.repo, checkpoint())
    env = {**os.environ, "HF_ENDPOINT": hub.start(), "HF_HOME": str(tmp_path / "hf"), "PYTHONPATH": str(clone),
           "XDG_CACHE_HOME": str(tmp_path / "xdg"), "DOCKER_HOST": f"unix://{tmp_path}/no-docker.sock",
           "HF_HUB_DISABLE_TELEMETRY": "1"}
    env.pop("HF_HUB_OFFLINE", None)
    folder = tmp_path / "models" / "Qwen3.x-27B-GPTQ-Int4"
    outs = []
    try:
        for line in lines:
            argv = shlex.split(line)
            if argv[0] != "escha-deploy" or argv[1] not in ("model", "plan", "up") or (
                    argv[1] == "up" and "--dry-run" not in argv):
                continue  # Docker, the image build, a real up and ask: not on this machine
            argv = [a.replace(prof.model.host_dir, str(folder)) for a in argv[1:]]
            if argv[:2] != ["model", "verify"]:
                argv += ["--set", f"model.host_dir={folder}"]
            r = subprocess.run([sys.executable, "-m", "escha_deploy.cli.main", *argv], cwd=clone, env=env,
                               capture_output=True, text=True, timeout=120)
            outs.append((argv, r))
    finally:
        hub.stop()
    by = {" ".join(a[:2]): r for a, r in outs}
    pull, verify, plan, dry = by["model pull"], by["model verify"], by["plan -p"], by["up -p"]
    assert pull.returncode == 0, pull.stderr
    assert pull.stdout.startswith(f"{prof.model.checkpoint.repo}@{commit[:12]}\t{folder}\t5 files verified")
    assert verify.returncode == 0 and "5 files verified" in verify.stdout, verify.stderr
    text = " ".join(plan.stdout.split())
    assert f"weights: headers (safetensors headers in {folder}" in text, plan.stdout
    assert f"pinned {prof.model.checkpoint.repo}@{commit[:12]}" in text
    assert "MTP tensors apart" in text  # the tiny checkpoint's mtp tensor is counted apart
    lines_out = dry.stdout.splitlines()
    curl = lines_out[lines_out.index("# once `up` is ready, the first request (curl)") + 1]
    assert curl.startswith("curl -sS --fail-with-body http://127.0.0.1:30000/v1/chat/completions")
    assert '"model":"qwen3.x-27b-int4"' in curl
