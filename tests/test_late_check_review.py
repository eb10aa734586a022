"""A release whose late checks are partly reviewed says so on every plan, and which stages.

``scripts/gen_late_checks.py`` writes ``late-checks-review.json`` beside a release's
``late-checks.md`` while its ``late-checks.yaml`` says ``review: incomplete`` (the unreviewed rows
by startup area) and removes it when none is left; every plan of that release carries the
summary as a warning (``sglang.releases.late_check_review``), and a release fully reviewed says
nothing.
"""

from __future__ import annotations

import json
import re

import pytest
import yaml

from escha_deploy.sglang.releases import late_check_review, release_file, supported_releases


@pytest.mark.parametrize("release", supported_releases())
def test_the_summary_exists_exactly_while_the_review_is_incomplete_and_counts_the_table(release):
    incomplete = (yaml.safe_load(release_file(release, "late-checks.yaml").read_text()) or {}).get("review") \
        == "incomplete"
    table = release_file(release, "late-checks.md").read_text()
    m = re.search(r"^\d+ checks: .*?(\d+) unreviewed", table, re.M)  # the table's count line
    summary = release_file(release, "late-checks-review.json")
    assert summary.is_file() is bool(m), release
    if m:
        assert incomplete
        data = json.loads(summary.read_text())
        assert data["release"] == release and data["unreviewed"] == int(m.group(1)) == sum(data["areas"].values())


@pytest.mark.parametrize("profile", ["rtx5060ti-tp2-fp8", "linux-tp2-l3", "rtx5090-tp2-mtp3-l3"])
@pytest.mark.parametrize("release", supported_releases())
def test_every_plan_of_a_partly_reviewed_release_says_so(cli, profile, release):
    r = cli("plan", "-p", profile, "--host-ram", "128GiB", "--sglang-version", release, "--format", "json")
    assert r.code in (0, 3), r.err
    said = [w for w in json.loads(r.out)["warnings"] if "late checks are partly reviewed" in w]
    expected = late_check_review(release)
    if expected is None:
        assert said == []
    else:
        data = json.loads(release_file(release, "late-checks-review.json").read_text())
        assert said == [expected]
        assert f"{data['unreviewed']} of the startup refusals" in said[0]
        assert all(f"{area} {n}" in said[0] for area, n in data["areas"].items())
