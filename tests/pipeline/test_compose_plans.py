"""`compose` without --facts invents no host: the file's render plans nothing (its container
plans for itself, ``serve --profile``), and `escha-deploy compose` plans this machine once, for
its warnings and the rendered argv's check. With --facts the box's facts are planned, once, and
this machine not at all. Counted on the real planner (``planner.plan`` wrapped, not replaced)."""

from __future__ import annotations

from unittest import mock

import yaml

from escha_deploy import planner
from tests.inproc import run_main

PROFILE = "rtx5060ti-tp2-fp8"


def _counted():
    """``planner.plan`` wrapped: the real planner, each call's host source recorded."""
    seen: list[str] = []
    real = planner.plan

    def plan(profile, host, **kw):
        seen.append(host.source)
        return real(profile, host, **kw)

    return seen, mock.patch.object(planner, "plan", plan)


def test_the_render_without_facts_plans_nothing():
    from escha_deploy.launch.compose import compose_profile

    seen, patch = _counted()
    with patch:
        rendered = compose_profile(PROFILE)
    assert seen == [] and rendered.plan is None
    svc = yaml.safe_load(rendered.text)["services"]["sglang"]
    assert svc["command"] == ["--profile", PROFILE]
    assert svc["deploy"]["resources"]["reservations"]["devices"][0]["count"] == 2  # Linux's GPU count


def test_compose_plans_this_machine_once(tmp_path):
    seen, patch = _counted()
    with patch:
        r = run_main("compose", "-p", PROFILE, env={"XDG_CACHE_HOME": str(tmp_path)})
    assert r.code == 0, r.err
    assert seen == ["live"]  # this machine, as `plan` plans it; no described 64 GiB host


def test_compose_with_facts_plans_the_box_once_and_not_this_machine(tmp_path):
    facts = tmp_path / "box.json"
    assert run_main("plan", "-p", PROFILE, "--host-ram", "64GiB", "--linux", "--write-facts", str(facts)).code == 0
    seen, patch = _counted()
    with patch:
        r = run_main("compose", "-p", PROFILE, "--facts", str(facts))
    assert r.code == 0, r.err
    assert seen == ["facts"]


def test_a_flag_the_release_refuses_is_refused_with_or_without_a_plan(tmp_path):
    """The same line as `plan`'s, exit 2, nothing written: from the render's own check
    (``pipeline.plan_request`` with no facts) and from the plan of this machine."""
    sets = ["--set", "runtime.extra_args=[--no-such-flag-escha]"]
    p = run_main("plan", "-p", PROFILE, *sets, "--host-ram", "64GiB")
    assert p.code == 2
    line = next(ln for ln in p.err.splitlines() if "--no-such-flag-escha" in ln)
    out = tmp_path / "c.yaml"
    c = run_main("compose", "-p", PROFILE, *sets, "-o", str(out))
    assert c.code == 2 and line in c.err.splitlines(), c.err
    assert not out.exists()
    from escha_deploy.utils.errors import BadInput
    from escha_deploy.launch.compose import compose_profile

    try:
        compose_profile(PROFILE, [sets[1]])
    except BadInput as exc:
        assert line.removeprefix("error: ") in exc.problems
    else:
        raise AssertionError("compose_profile rendered an argv its release refuses")
