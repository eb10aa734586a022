"""`up`, `serve` and `compose` give the same "HiCache is off" warning for the same plan: one
function (``pipeline.hicache_off_warning``) writes it for all three."""

from __future__ import annotations

PROFILE = "rtx5060ti-tp2"


def _warning(err: str, prefix: str) -> str:
    lines = [ln.removeprefix(prefix) for ln in err.splitlines() if ln.startswith(prefix + "plan: HiCache is off")]
    assert len(lines) == 1, err
    return lines[0]


def test_up_serve_and_compose_print_the_same_hicache_off_line(cli, tmp_path, monkeypatch):
    # a 12 GiB box: no ratio >= hicache.min_ratio fits, so the plan turns HiCache off
    facts = tmp_path / "small.json"
    assert cli("plan", "-p", PROFILE, "--host-ram", "12GiB", "--write-facts", str(facts)).code == 0
    # no Docker daemon answers: `up --dry-run` plans without it (and starts no container)
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path / 'no-daemon.sock'}")
    up = cli("up", "--dry-run", "-p", PROFILE, "--facts", str(facts))
    serve = cli("serve", "--profile", PROFILE, "--facts", str(facts), "--print")
    compose = cli("compose", "-p", PROFILE, "--facts", str(facts), "-o", str(tmp_path / "compose.yaml"))
    assert compose.code == 0, compose.err
    lines = {_warning(up.err, "warning: "), _warning(serve.err, "warning: "),
             _warning(compose.err, "compose: warning: ")}
    assert len(lines) == 1, lines
    line = lines.pop()
    assert "MemTotal 12.00 GiB (facts file)" in line and line.endswith("the server is launchable without it)")


def test_no_hicache_off_line_when_the_plan_keeps_hicache():
    from escha_deploy.pipeline import DescribedHost, ProfileTarget, hicache_off_warning, plan_request
    from escha_deploy.profile import load_profile

    prof = load_profile("rtx5060ti-tp2-fp8", [])
    plan = plan_request(prof, DescribedHost(64 * 2**30), ProfileTarget()).plan
    assert plan.verdict == "ok" and hicache_off_warning(plan) is None
