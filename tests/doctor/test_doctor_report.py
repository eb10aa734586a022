"""The report model: one-line fixes and the exit codes (0 ok, 2 bad input, 3 refused or not satisfied, 4 started but failed, 5 inconclusive)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from escha_deploy.doctor.report import Check, DoctorReport, fail, ok, warn


def test_warn_and_fail_need_a_fix():
    with pytest.raises(ValidationError):
        Check(id="x", status="warn", detail="seen")
    with pytest.raises(ValidationError):
        Check(id="x", status="fail", detail="seen", fix="two\nlines")


def _report(profile, *checks):
    return DoctorReport(created_at="2026-11-29T00:00:00+00:00", host_id="h", profile=profile, checks=list(checks))


def test_exit_codes():
    bad = fail("profile.gpus", "no GPU", "install a driver", profile=True)
    host_bad = fail("probe.store", "nothing works", "disable HiCache")
    assert _report(None, bad).exit_code == 0  # without a profile: 0 once the checks ran
    assert _report("p", bad).exit_code == 3
    assert _report("p", host_bad, warn("host.shm", "64 MiB", "--ipc=host"), ok("profile.vram", "ok", profile=True)).exit_code == 0
    assert _report("p", bad).failed_profile_checks() == [bad]
