"""Every printed ``escha-deploy`` command runs as printed (tests/hints.py collects them from the
whole suite; these are the checker's own cases and a profile file named by its file name)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1]))
import hints  # noqa: E402

from escha_deploy.utils.paths import profiles_dir  # noqa: E402


@pytest.mark.parametrize("command, bad", [
    ("escha-deploy plan --profile rtx5060ti-tp2-fp8", None),
    ("escha-deploy doctor --format json > FILE", None),          # the shell's part is the user's
    ("escha-deploy doctor --profile PROFILE", None),             # a placeholder in capitals
    ("escha-deploy logs --profile rtx5060ti-tp2-fp8 -f", None),
    ("escha-deploy plan --profile myseed", "unknown profile 'myseed'"),
    ("escha-deploy plan --bogus", "No such option: --bogus"),
    ("escha-deploy runtime import", "Missing argument"),
    ("escha-deploy fleet", "does not parse"),
])
def test_checker(command, bad):
    why = hints.check(command)
    assert (why is None) if bad is None else (bad in (why or "")), why


def test_a_hint_outside_backticks_is_caught():
    before = set(hints.BAD)
    hints.record("hint: stop it: escha-deploy down --profile x\nhint: from the escha-deploy checkout")
    new = [hints.BAD.pop(k) for k in set(hints.BAD) - before]  # caught here, not a session failure
    assert len(new) == 1 and "not in backticks" in new[0]


@pytest.fixture
def myseed(tmp_path, monkeypatch):
    """A profile file whose name (``myseed``) is no shipped profile, used as ``-p myseed.yaml``."""
    text = (profiles_dir() / "rtx5060ti-tp2-fp8.yaml").read_text()
    (tmp_path / "myseed.yaml").write_text(text.replace("name: rtx5060ti-tp2-fp8", "name: myseed"))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path


def _bad(text: str, cwd: Path) -> list:
    printed = hints.commands(text)
    assert printed, text  # the case prints a command to run
    return [(c, why) for c in printed if (why := hints.check(c, cwd))]


def test_plan_hints_for_a_profile_file_run_as_printed(cli, myseed):
    r = cli("plan", "-p", "myseed.yaml", "--host-ram", "16GiB", "--wsl2")
    assert _bad(r.out + r.err, myseed) == []


def test_doctor_fixes_for_a_profile_file_run_as_printed(myseed):
    """doctor's fixes, with a recorded NVML answer of two RTX 5060 Ti (a stand-in: no GPU here)."""
    from escha_deploy.facts.gpus import GpuInventory, GpuRecord
    from escha_deploy.doctor.hostinfo import DockerFacts
    from escha_deploy.doctor.run import run_doctor
    from escha_deploy.utils.units import GiB

    two = GpuInventory(source="nvml", gpus=[GpuRecord(index=i, name="NVIDIA GeForce RTX 5060 Ti", memory_total_bytes=16 * GiB)
                                            for i in range(2)])
    r = run_doctor("myseed.yaml", probes=False, findings_path=myseed / "d.json",
                   docker=lambda: DockerFacts(reachable=False), gpus=lambda: two)
    assert _bad(" ".join(c.fix or "" for c in r.checks), myseed) == []


def test_pending_verbs_do_not_exist_yet():
    """An allowance in ``hints.PENDING`` goes once its verb exists (then this fails)."""
    root = hints._app()
    for group, verb in hints.PENDING:
        assert verb not in root.commands[group].commands, f"{group} {verb} exists: drop it from hints.PENDING"
