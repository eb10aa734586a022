"""A native `serve` given inputs it cannot use says so in one line and starts nothing: an HF
token file that is missing or unreadable (as the API key file), a ``model.host_dir`` longer
than a path may be (``ENAMETOOLONG``), and a runtime folder (``$XDG_RUNTIME_DIR``) it cannot
write: read-only for this user (a real folder, with root's capabilities dropped by util-linux
``setpriv``), or full (fault injection: ``ENOSPC`` from ``os.mkdir``/``os.open`` at each file
`serve` writes there: the port lock, the state file, the secrets folder, the log).

The server is the stand-in of test_native.py (SGLang cannot start here); a run that gets as far
as starting it would print its ``argv=`` line, which these tests assert is absent."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import STANDIN_PROFILE, run_cli
from .test_native import STANDIN_SGLANG, serve_env

KEY = "sk-escha-inputs-0123456789"
DROP_CAPS = (("setpriv", "--inh-caps=-dac_override,-dac_read_search",
              "--bounding-set=-dac_override,-dac_read_search") if os.geteuid() == 0 else ())


@pytest.fixture
def fake(tmp_path):
    p = tmp_path / "standin_sglang.py"
    p.write_text(STANDIN_SGLANG)
    p.chmod(0o755)
    k = tmp_path / "api_key"
    k.write_text(KEY + "\n")
    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    return str(p), str(k), run


def args(key: str, *more: str) -> list[str]:
    return ["serve", "--profile", str(STANDIN_PROFILE), "--set", "runtime.needs=[]",
            "--set", "hicache.enabled=false", "--set", f"container.api_key_file={key}",
            "--set", "container.stop_timeout_s=2", *more]


def one_error(r: subprocess.CompletedProcess) -> str:
    errs = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert len(errs) == 1 and "Traceback" not in r.stderr, r.stderr
    assert "argv=" not in r.stderr + r.stdout  # the server never started
    return errs[0]


@pytest.mark.parametrize("shape", ["missing", "directory", "unreadable"])
def test_an_hf_token_file_it_cannot_read_is_refused_like_the_api_key_file(fake, tmp_path, shape):
    script, key, run = fake
    hf = tmp_path / "hf_token"
    if shape == "directory":
        hf.mkdir()
    elif shape == "unreadable":
        hf.write_text("hf_" + "Zq9" * 12 + "\n")
        hf.chmod(0)
    cmd = [sys.executable, "-m", "escha_deploy.cli.main",
           *args(key, "--set", f"container.hf_token_file={hf}")]
    r = subprocess.run([*DROP_CAPS, *cmd], capture_output=True, text=True, timeout=120,
                       env=serve_env(script, XDG_RUNTIME_DIR=str(run)))
    assert r.returncode == 2, r.stderr
    line = one_error(r)
    assert line.startswith("error: hf token file: cannot read a value from"), line
    assert "Zq9" not in r.stderr + r.stdout


def test_a_5000_character_host_dir_is_one_line(fake):
    script, key, run = fake
    long = "/tmp/" + "m" * 5000
    r = run_cli(*args(key, "--set", f"model.host_dir={long}"), env=serve_env(script, XDG_RUNTIME_DIR=str(run)))
    assert r.returncode == 2, r.stderr[-2000:]
    line = one_error(r)
    assert "model.host_dir: /tmp/mmm" in line and "(5,005 characters) cannot be used here: File name too long" in line
    assert len(line) < 300


def test_a_read_only_runtime_folder_is_one_line(fake):
    script, key, run = fake
    run.chmod(0o500)
    cmd = [sys.executable, "-m", "escha_deploy.cli.main", *args(key)]
    r = subprocess.run([*DROP_CAPS, *cmd], capture_output=True, text=True, timeout=120,
                       env=serve_env(script, XDG_RUNTIME_DIR=str(run)))
    assert r.returncode == 3, r.stderr
    line = one_error(r)
    assert line == f"error: serve: cannot write in $XDG_RUNTIME_DIR ({run}): Permission denied; nothing was started"
    assert list(run.iterdir()) == []


@pytest.mark.parametrize("call, where", [
    ("mkdir", "escha-deploy-"),       # the private runtime folder itself
    ("open", ".lock"),                # the port lock
    ("open", ".json"),                # the state file (its temporary sibling)
    ("mkdir", "escha-serve-"),        # the secrets folder (inside the supervisor)
    ("open", ".log"),                 # the log copy (inside the supervisor)
])
def test_a_full_runtime_folder_is_one_line_at_each_write(fake, monkeypatch, capsys, call, where):
    """Fault injection in this process: the named call raises ENOSPC for a path under the
    runtime folder that holds ``where``; `serve` refuses (exit 3) and leaves no state file."""
    from escha_deploy.cli.main import main

    script, key, run = fake
    for k, v in serve_env(script, XDG_RUNTIME_DIR=str(run)).items():
        monkeypatch.setenv(k, v)
    real = getattr(os, call)

    def full(path, *a, **k):
        if str(path).startswith(str(run)) and where in os.path.basename(str(path)):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        return real(path, *a, **k)

    monkeypatch.setattr(os, call, full)
    try:
        rc = main(args(key))
    except SystemExit as exc:
        rc = exc.code
    monkeypatch.undo()
    err = capsys.readouterr().err
    assert rc == 3, err
    errs = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert errs == [f"error: serve: cannot write in $XDG_RUNTIME_DIR ({run}): No space left on device; "
                    "nothing was started"], err
    assert "argv=" not in err
    assert not list(Path(run).glob("escha-deploy-*/serve-*.json"))
