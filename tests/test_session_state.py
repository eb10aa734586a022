"""The suite keeps its state in folders of its own (tests/session_state.py, imported first by
tests/conftest.py): a CLI call it makes, in-process or in a subprocess, never reads or writes
the user's ~/.cache (``paths.cache_dir``) or the shared runtime folder
(``launch.native.runtime_dir``), and two copies of the suite on one machine never share either."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import session_state

#: A bench record of the profile's own model (its served_model_name), so the plan would use it
#: if it saw it; only where it is found is under test.
PLANTED = {"created_at": "2026-12-01T10:00:00+00:00", "url": "http://127.0.0.1:9", "model": "qwen3.8-27b-escha-w2",
           "hicache": False, "prompt_tokens": 2000, "tokens_per_s": 123456.0}


def _under(path: str | Path, folder: str | Path) -> bool:
    return Path(os.path.realpath(path)).is_relative_to(os.path.realpath(folder))


def test_the_session_state_folders_are_its_own():
    assert session_state.BEFORE_ESCHA_DEPLOY  # conftest set them up first
    for var in session_state.STATE_ENV:
        d = session_state.SESSION_STATE[var]
        assert os.path.isdir(d) and f"escha-test-{os.getpid()}-" in d  # this session's, by pid
        assert not _under(d, Path.home() / ".cache")
    assert _under(session_state.SESSION_STATE["XDG_RUNTIME_DIR"], "/dev/shm") or not os.path.isdir("/dev/shm")


def test_a_subprocess_finds_its_state_in_the_session_folders():
    code = ("from escha_deploy.utils.paths import cache_dir; from escha_deploy.facts.saved import last_prefill_path; "
            "from escha_deploy.launch.native import runtime_dir; "
            "print(cache_dir()); print(last_prefill_path()); print(runtime_dir(make=False))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=dict(os.environ), check=True)
    cache, last, run = r.stdout.split()
    assert _under(cache, session_state.SESSION_STATE["XDG_CACHE_HOME"]) and _under(last, cache)
    assert _under(run, session_state.SESSION_STATE["XDG_RUNTIME_DIR"])


def test_the_real_cli_in_a_subprocess_cannot_see_the_home_cache(tmp_path):
    """A bench record planted in ~/.cache of a stand-in home is not what the plan reads: the
    session's XDG_CACHE_HOME is (before it was set, the plan printed the planted rate)."""
    home = tmp_path / "home"
    (home / ".cache" / "escha-deploy").mkdir(parents=True)
    (home / ".cache" / "escha-deploy" / "bench-last.json").write_text(json.dumps(PLANTED))
    env = {**os.environ, "HOME": str(home)}
    r = subprocess.run([sys.executable, "-m", "escha_deploy.cli.main", "plan", "-p", "rtx5060ti-tp2", "-f", "json"],
                       capture_output=True, text=True, env=env, timeout=120)
    hh = json.loads(r.stdout)["host_hit_cost"]
    assert hh["prefill_tokens_per_s"] != PLANTED["tokens_per_s"], hh["prefill_source"]
    assert "bench" not in hh["prefill_source"].split("(")[0]
