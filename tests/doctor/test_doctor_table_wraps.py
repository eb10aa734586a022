"""doctor's table at 80 columns wraps its columns and never cuts them: every character of a
long fix (an unbroken URL, a long command) is printed (rich's default overflow, ellipsis,
ended such a word with "…")."""

from __future__ import annotations

import re

LONG_FIX = ("install the toolkit: https://docs.nvidia.com/datacenter/cloud-native/container-toolkit/latest/"
            "install-guide.html#configuring-docker then `sudo nvidia-ctk runtime configure --runtime=docker`")
LONG_SEEN = "/usr/lib/x86_64-linux-gnu/libnvidia-container-go.so.1.17.8-some-very-long-unbroken-file-name"


def test_doctor_table_wraps_never_cuts_at_80_columns(monkeypatch, capsys):
    from escha_deploy.cli.doctor import render_table
    from escha_deploy.doctor.report import Check, DoctorReport

    monkeypatch.setenv("COLUMNS", "80")
    report = DoctorReport(created_at="2026-12-01T21:00:00Z", host_id="h", profile=None,
                          checks=[Check(id="docker.gpu_runtime_with_a_long_id", status="fail",
                                        detail=LONG_SEEN, fix=LONG_FIX)])
    render_table(report)
    out = capsys.readouterr().out
    assert "…" not in out
    assert max(len(line) for line in out.splitlines()) <= 80, out
    # the cells read back whole, column by column (the box's verticals split the columns)
    rows = [[c.strip() for c in re.split(r"[│┃]", line)[1:-1]] for line in out.splitlines() if line.startswith("│")]
    cols = list(zip(*rows))
    joined = ["".join(c) for c in cols]
    assert LONG_FIX.replace(" ", "") in joined[3].replace(" ", ""), joined[3]
    assert LONG_SEEN in joined[2].replace(" ", ""), joined[2]
    assert "docker.gpu_runtime_with_a_long_id" in joined[0]
