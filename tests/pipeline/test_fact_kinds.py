"""Every host fact of a plan says its kind of source (``facts.provenance.ProvenanceKind``), and
the kind is the source's: ``/proc`` and the cgroup files on this host, the facts file with
``--facts``, the command line with ``--host-ram``."""

import json
import typing

from escha_deploy.facts.provenance import ProvenanceKind

KINDS = set(typing.get_args(ProvenanceKind))
HOST_FACTS = {"platform", "MemTotal", "cgroup memory limit", "pinned ceiling per process", "host allocator",
              "model", "GPUs"}


def _kinds(cli, *args: str) -> dict[str, str]:
    r = cli("plan", "-p", "rtx5060ti-tp2-fp8", *args, "-f", "json")
    assert r.code in (0, 3), r.err
    sources = json.loads(r.out)["fact_sources"]
    assert {s["fact"] for s in sources} == HOST_FACTS
    assert all(s.get("kind") in KINDS for s in sources), sources
    return {s["fact"]: s["kind"] for s in sources}


def test_this_host_facts_are_proc_and_cgroup(cli):
    kinds = _kinds(cli)
    assert kinds["platform"] == kinds["MemTotal"] == "proc"
    assert kinds["cgroup memory limit"] == "cgroup"
    # no doctor findings in the test's own cache folder: the ceiling is not measured
    assert kinds["pinned ceiling per process"] == "unmeasured"
    assert kinds["host allocator"] == "default"
    assert kinds["model"] == "profile"  # no model folder here
    assert kinds["GPUs"] in ("nvml", "profile")


def test_a_facts_files_memory_says_facts_file(cli, tmp_path):
    facts = tmp_path / "box.json"
    facts.write_text(json.dumps({"schema_version": 1, "host": {"platform": "linux", "mem_total_bytes": 64 * 2**30},
                                 "gpus": [{"index": 0}, {"index": 1}]}))
    kinds = _kinds(cli, "--facts", str(facts))
    assert {kinds[k] for k in ("platform", "MemTotal", "cgroup memory limit", "GPUs")} == {"facts_file"}
    assert kinds["pinned ceiling per process"] == "unmeasured"
    # --wsl2 overrides the file's platform: the flag is that fact's source
    assert _kinds(cli, "--facts", str(facts), "--wsl2")["platform"] == "command_line"


def test_a_described_host_is_the_command_line(cli):
    kinds = _kinds(cli, "--host-ram", "64GiB", "--wsl2")
    assert kinds["platform"] == kinds["MemTotal"] == kinds["cgroup memory limit"] == "command_line"
    assert kinds["GPUs"] == "profile"


def test_a_described_hosts_platform_is_a_default_unless_given(cli):
    """``--host-ram`` without ``--wsl2``/``--linux`` plans a Linux host by default: nothing of
    this machine is read, so its platform is never "measured now" (/proc/version)."""
    r = cli("plan", "-p", "rtx5060ti-tp2-fp8", "--host-ram", "64GiB", "-f", "json")
    assert r.code in (0, 3), r.err
    platform = next(s for s in json.loads(r.out)["fact_sources"] if s["fact"] == "platform")
    assert (platform["value"], platform["kind"]) == ("linux", "default")
    assert platform["source"].startswith("default (--host-ram names no platform")
    assert "measured" not in platform["source"] and "/proc" not in platform["source"]
    assert _kinds(cli, "--host-ram", "64GiB", "--linux")["platform"] == "command_line"


def test_a_fleet_box_described_without_a_platform_says_the_default():
    """The same reader for a fleet box's ``host_ram``: its platform, when the box names none,
    is the default, and its memory comes from the fleet file."""
    from escha_deploy.pipeline import DescribedHost, read_described_host

    reading = read_described_host(DescribedHost(64 * 2**30, origin="fleet.yaml:3 boxes.a.host_ram"))
    kinds = {s.fact: (s.kind, s.source) for s in reading.facts}
    assert kinds["platform"] == ("default", "default (fleet.yaml:3 boxes.a.host_ram names no platform; "
                                            "--wsl2 describes a WSL2 host)")
    assert kinds["MemTotal"] == ("fleet_file", "fleet.yaml:3 boxes.a.host_ram")
    assert reading.findings is None and reading.facts_file is None and reading.host.platform == "linux"


def test_up_dry_run_names_each_facts_kind_and_the_capabilities(cli, tmp_path):
    """`up --dry-run` carries the same kinds in its facts, plus where the image's capabilities
    came from (its labels or runtime description file; the profile's needs when not read)."""
    facts = tmp_path / "box.json"
    facts.write_text(json.dumps({"schema_version": 1, "host": {"platform": "linux", "mem_total_bytes": 128 * 2**30}}))
    r = cli("up", "--dry-run", "-p", "rtx5060ti-tp2-fp8", "--facts", str(facts), "-f", "json")
    sources = json.loads(r.out)["facts"]
    assert all(s.get("kind") in KINDS for s in sources), sources
    kinds = {s["fact"]: s["kind"] for s in sources}
    assert kinds.keys() == HOST_FACTS | {"capabilities"}
    assert kinds["MemTotal"] == "facts_file"
    caps = next(s for s in sources if s["fact"] == "capabilities")
    assert (caps["kind"] == "profile") == caps["source"].startswith("assumed: the profile's runtime.needs")
    assert caps["kind"] in ("profile", "image_labels", "runtime_description")


def test_gather_reads_doctors_findings_once(tmp_path, monkeypatch):
    """This host's reader reads doctor's saved findings once: the facts, their sources and
    ``plan --write-facts`` (``Gathered.findings``) all come from that one reading."""
    import escha_deploy.facts.saved as findings_mod
    from escha_deploy.facts.findings import DoctorFindings
    from escha_deploy.facts.machine import host_id
    from escha_deploy.utils.paths import doctor_findings_path
    from escha_deploy.pipeline import ThisHost, gather
    from escha_deploy.profile import load_profile

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    saved = DoctorFindings(created_at="2026-11-30T00:00:00+00:00", host_id=host_id(), host_allocator="register",
                           pinned_ceiling_bytes=8 * 2**30, pinned_ceiling_reached=True)
    findings_mod.save_findings(saved, doctor_findings_path())
    calls = []
    real = findings_mod.load_findings
    monkeypatch.setattr(findings_mod, "load_findings", lambda *a, **k: calls.append(a) or real(*a, **k))
    g = gather(load_profile("rtx5060ti-tp2-fp8"), ThisHost())
    assert len(calls) == 1
    assert g.findings == saved and g.host.pinned_ceiling_bytes == 8 * 2**30
    kinds = {s.fact: s.kind for s in g.facts}
    assert kinds["pinned ceiling per process"] == kinds["host allocator"] == "findings"
