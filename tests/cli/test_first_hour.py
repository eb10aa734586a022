"""The dead ends a new user met in their first hour, each as the CLI prints it now."""

from __future__ import annotations

import json


def _no_daemon(monkeypatch, tmp_path) -> None:
    """A Docker daemon that is not there (a socket path nothing listens on): the daemon check
    fails the same way whether or not a daemon runs on this machine."""
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-docker.sock")


def _rows(out: str) -> dict[str, str]:
    """``up --dry-run``'s check table: check name -> state."""
    from escha_deploy.launch.up import PREFLIGHT

    rows = {}
    for line in out.splitlines():
        if not line.startswith("#   "):
            continue
        state, rest = line[4:14].strip(), line[15:]
        for name in PREFLIGHT:
            if rest.startswith(name + ":") or rest == name:
                rows[name] = state
    return rows


def test_dry_run_prints_every_check_when_the_l3_folder_is_missing(cli, monkeypatch, tmp_path):
    """`up --dry-run -p linux-tp2-l3` with no L3 folder printed nothing on stdout: the missing
    folder raised before the plan, and the daemon, plan and model folder failures were hidden."""
    _no_daemon(monkeypatch, tmp_path)
    l3 = tmp_path / "no-l3"
    model = tmp_path / "no-model"
    r = cli("up", "--dry-run", "-p", "linux-tp2-l3", "--set", f"hicache.l3.dir={l3}",
            "--set", f"model.host_dir={model}")
    assert r.code == 3, r.err
    rows = _rows(r.out)
    from escha_deploy.launch.up import PREFLIGHT

    assert set(rows) == set(PREFLIGHT), r.out  # every check has its line
    assert rows["docker daemon"] == "failed" and rows["L3 folder"] == "failed", r.out
    assert rows["model folder"] == "failed", r.out
    errors = [ln for ln in r.err.splitlines() if ln.startswith("error: ")]
    assert f"error: hicache.l3.dir: {l3} does not exist here; create it (mkdir -p {l3}) on a disk with room for the tier" \
        in errors
    assert any("model.host_dir / container.model_dir" in e for e in errors)
    assert len(errors) >= 3, errors
    data = json.loads(cli("up", "--dry-run", "-p", "linux-tp2-l3", "--set", f"hicache.l3.dir={l3}",
                          "--set", f"model.host_dir={model}", "-f", "json").out)
    by = {c["name"]: c for c in data["checks"]}
    assert by["L3 folder"]["state"] == "failed" and by["L3 folder"]["problems"], by["L3 folder"]


def test_dry_run_without_a_plan_still_names_every_check(cli, monkeypatch, tmp_path):
    """A bad facts file stops the plan; the table still lists every check, the rest not run."""
    _no_daemon(monkeypatch, tmp_path)
    bad = tmp_path / "facts.json"
    bad.write_text("{\n")
    r = cli("up", "--dry-run", "-p", "rtx5060ti-tp2-fp8", "--facts", str(bad))
    assert r.code in (2, 3), r.err
    rows = _rows(r.out)
    from escha_deploy.launch.up import PREFLIGHT

    assert set(rows) == set(PREFLIGHT), r.out
    assert rows["plan"] == "not run"
    assert f"{bad}:2: the facts file is not JSON" in r.err


SHIPPED = ["rtx5060ti-tp2", "rtx5060ti-tp2-fp8", "linux-tp2-l3"]


def test_each_shipped_profile_says_the_host_it_assumes_and_fits_it(cli):
    """linux-tp2-l3 did not say what host it assumes (and is unsafe on a 64 GiB box): every
    shipped profile names its MemTotal (hardware.host_ram) and plans ok on that host."""
    from escha_deploy.profile import load_profile

    for name in SHIPPED:
        prof = load_profile(name)
        assert prof.hardware.host_ram, name
        platform = "--linux" if prof.hardware.platform == "linux" else "--wsl2"
        r = cli("plan", "-p", name, "--host-ram", f"{prof.hardware.host_ram}B", platform, "-f", "json")
        assert json.loads(r.out)["verdict"] == "ok", (name, r.err)


def test_plan_on_a_smaller_host_says_the_smallest_ram_it_fits(cli):
    """On a 64 GiB Linux box linux-tp2-l3 is unsafe; the plan names the host it is sized for and
    the smallest MemTotal that fits as it is, and that size is the edge: 1 GiB less is unsafe."""
    r = cli("plan", "-p", "linux-tp2-l3", "--host-ram", "64GiB", "--linux")
    assert r.code == 3
    text = " ".join(r.out.split())
    assert ("host: linux-tp2-l3 is sized for a linux host with MemTotal 94.00 GiB (hardware.host_ram); this plan's "
            "host has 64.00 GiB; as it is, it fits from MemTotal 65.00 GiB") in text, text
    assert "use hicache_size <= 29" in text  # what to change on this host, from the reasons
    fit = json.loads(cli("plan", "-p", "linux-tp2-l3", "--host-ram", "64GiB", "--linux", "-f", "json").out)["host_fit"]
    edge = fit["fits_from_mem_total_bytes"]
    assert edge == 65 << 30
    assert json.loads(cli("plan", "-p", "linux-tp2-l3", "--host-ram", f"{edge}B", "--linux", "-f", "json").out)[
        "verdict"] == "ok"
    assert json.loads(cli("plan", "-p", "linux-tp2-l3", "--host-ram", f"{edge - (1 << 30)}B", "--linux",
                          "-f", "json").out)["verdict"] == "unsafe"
    ok = json.loads(cli("plan", "-p", "linux-tp2-l3", "--host-ram", "94GiB", "--linux", "-f", "json").out)
    assert ok["host_fit"] is None
