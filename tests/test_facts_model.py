"""The one facts model: the facts file's runtime section (SGLang release and capabilities, each
with its source), one provenance type, one reader for ``plan --facts`` and ``fleet``, and old
facts files reading and writing as before."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from escha_deploy.utils.errors import BadInput
from escha_deploy.facts.provenance import FactSource, Provenance
from escha_deploy.facts.factsfile import load_facts_file
from escha_deploy.sglang.releases import choose_release, default_release

GOLDEN_BOX = Path(__file__).parent / "golden" / "rtx5060ti-tp2" / "box.json"
REPORT = Path(__file__).parent / "doctor" / "fixtures"


def _write(tmp_path: Path, doc: dict, name: str = "box.json") -> Path:
    p = tmp_path / name
    p.write_text(json.dumps(doc))
    return p


def _runtime(**kw) -> dict:
    return {"sglang_release": default_release(),
            "sglang_release_source": {"kind": "runtime_description", "where": "/etc/escha/runtime.json"},
            "capabilities": [{"name": "hicache-host-reserve-env", "source": {"kind": "image_labels",
                                                                         "where": "io.escha.runtime.capabilities"}}],
            **kw}


def test_a_file_without_the_new_sections_reads_and_writes_as_before(tmp_path):
    old = json.loads(GOLDEN_BOX.read_text())
    ff = load_facts_file(GOLDEN_BOX)
    assert ff.runtime is None and ff.host.wsl_networking_mode is None
    # written back key for key: the runtime section and the report-only host keys are left out
    assert ff.model_dump(mode="json") == old


def test_the_runtime_section_carries_release_and_capabilities_with_their_sources(tmp_path):
    doc = {**json.loads(GOLDEN_BOX.read_text()), "runtime": _runtime()}
    ff = load_facts_file(_write(tmp_path, doc))
    rt = ff.runtime
    assert rt.capability_names() == ["hicache-host-reserve-env"]
    assert rt.capabilities[0].source == Provenance(kind="image_labels", where="io.escha.runtime.capabilities")
    # the pair releases.choose_release takes as an image's claim: its source is named
    choice = choose_release(image=rt.release_claim())
    assert (choice.version, choice.source) == (default_release(), "/etc/escha/runtime.json")
    assert json.loads(ff.model_dump_json())["runtime"] == {**_runtime(), "image_ref": None, "image_id": None}


@pytest.mark.parametrize("runtime, field", [
    ({"sglang_release": "0.5.19"}, "runtime: Value error, sglang_release_source: missing"),
    ({"sglang_release": "0.5", "sglang_release_source": {"kind": "profile"}}, "runtime.sglang_release:"),
    ({"sglang_release_source": {"kind": "guess"}}, "runtime.sglang_release_source.kind:"),
    (_runtime(capabilities=[_runtime()["capabilities"][0]] * 2), "hicache-host-reserve-env is listed twice"),
    ({"capabilities": [{"name": "Bad Name", "source": {"kind": "default"}}]}, "runtime.capabilities.0.name:"),
    ({"image_id": "abc"}, "runtime.image_id:"),
    ({"sglang_release": 519, "sglang_release_source": {"kind": "profile"}}, "runtime.sglang_release:"),
])
def test_a_bad_runtime_section_is_one_line_naming_the_field(tmp_path, runtime, field):
    p = _write(tmp_path, {**json.loads(GOLDEN_BOX.read_text()), "runtime": runtime})
    with pytest.raises(BadInput) as err:
        load_facts_file(p)
    assert err.value.problems[0].startswith(f"{p}: ") and field in err.value.problems[0], err.value.problems


def _report(tmp_path: Path, image_id: str | None) -> Path:
    from escha_deploy.doctor.facts import gather_facts
    from escha_deploy.doctor.hostinfo import DockerFacts, ImageFacts
    from escha_deploy.doctor.run import build_report
    from escha_deploy.facts.gpus import GpuInventory
    import datetime as dt

    facts = gather_facts(REPORT / "wsl2-distro-engine", {}, docker=lambda: DockerFacts(reachable=False),
                         gpus=lambda: GpuInventory(source="none"), networking_mode=lambda: "mirrored",
                         image=lambda: ImageFacts(ref="escha-sglang:0.5.19-hicache", id=image_id))
    report = build_report(facts, None, dt.datetime(2026, 11, 30, tzinfo=dt.timezone.utc))
    return _write(tmp_path, report.model_dump(mode="json"), "report.json")


def test_fleet_and_plan_facts_read_a_box_through_one_reader_once(tmp_path):
    """`fleet plan` reads a box's facts file once, through the reader of `plan --facts`
    (pipeline.gather -> factsfile.load_facts_file), and keeps what it read for the fleet's own
    checks (a WSL2 node's networking mode, the image digest)."""
    from unittest import mock

    import yaml

    import escha_deploy.facts.factsfile as factsfile
    from escha_deploy.fleet.model import load_fleet
    from escha_deploy.fleet.plan import plan_fleet

    image = "sha256:" + "c" * 64
    for p in (_report(tmp_path, image), GOLDEN_BOX):
        fleet = tmp_path / "fleet.yaml"
        fleet.write_text(yaml.safe_dump({"name": "one", "boxes": [
            {"name": "b", "address": "127.0.0.1", "profile": "rtx5060ti-tp2", "facts": str(p)}]}))
        with mock.patch.object(factsfile, "load_facts_file", wraps=factsfile.load_facts_file) as read:
            fp = plan_fleet(load_fleet(fleet))
        assert [str(c.args[0]) for c in read.call_args_list] == [str(p)]
        assert fp.box_plan("b").facts == load_facts_file(p)
    ff = load_facts_file(_report(tmp_path, image))
    assert (ff.host.platform, ff.host.wsl_networking_mode) == ("wsl2", "mirrored")
    assert (ff.runtime.image_ref, ff.runtime.image_id, ff.runtime.sglang_release) == (
        "escha-sglang:0.5.19-hicache", image, None)


def test_a_report_with_a_bad_image_digest_names_its_key(tmp_path):
    p = _report(tmp_path, "sha256 and no digest")
    with pytest.raises(BadInput) as err:
        load_facts_file(p)
    assert err.value.problems[0].startswith(f"{p}: facts.image.id: "), err.value.problems


def test_one_provenance_type_and_its_kind_only_when_named():
    from escha_deploy.pipeline import spec as launch_spec

    assert launch_spec.FactSource is FactSource
    plain = FactSource(fact="MemTotal", value="16 GiB", source="facts file box.json")
    assert plain.model_dump() == {"fact": "MemTotal", "value": "16 GiB", "source": "facts file box.json"}
    kinded = FactSource(fact="MemTotal", value="16 GiB", source="/proc/meminfo", kind="proc")
    assert kinded.model_dump()["kind"] == "proc"
    assert str(Provenance(kind="unmeasured")) == "unmeasured" and str(Provenance(kind="proc", where="/proc/meminfo")) == "/proc/meminfo"


def test_the_planners_host_facts_of_a_file_and_back(tmp_path):
    from escha_deploy.facts.file import FactsFile
    from escha_deploy.facts.findings import DoctorFindings

    doc = json.loads(GOLDEN_BOX.read_text())
    doc["host"].update(hugetlb_bytes=2**30, cgroup_limit_bytes=64 * 2**30, host_id="abc")
    doc["findings"] = DoctorFindings(created_at="2026-11-30T00:00:00+00:00", host_id="abc", host_allocator="pinned",
                                     pinned_ceiling_bytes=8 * 2**30, pinned_ceiling_reached=True).model_dump(mode="json")
    ff = load_facts_file(_write(tmp_path, doc))
    host = ff.host_facts(platform="wsl2", l3_checked=True)
    assert (host.source, host.platform, host.mem_total_bytes, host.hugetlb_bytes, host.cgroup_limit_bytes) == (
        "facts", "wsl2", ff.host.mem_total_bytes, 2**30, 64 * 2**30)
    assert (host.pinned_ceiling_bytes, host.pinned_ceiling_reached, host.host_allocator) == (8 * 2**30, True, "pinned")
    assert (host.l3_checked, host.host_id) == (True, "abc")
    assert [g.index for g in host.gpus.gpus] == [g.index for g in ff.gpus] and host.gpus.source == "nvml"
    # written back from the planner's facts: the same host section, findings and GPU records
    back = FactsFile.from_host(ff.host_facts(), ff.findings, ff.gpus)
    assert (back.host, back.findings, back.gpus) == (ff.host, ff.findings, ff.gpus)


def test_a_runtime_description_is_a_runtime_section_the_release_choice_and_capability_check_read(tmp_path):
    from escha_deploy.utils.errors import Refused
    from escha_deploy.runtime.description import RuntimeDescription, require_capabilities

    desc = RuntimeDescription(sglang_version=default_release(), base="wheel:x", base_inventory_digest="0" * 64,
                              base_inventory_committed=True, python="3.11.2", sglang_dir="/s",
                              capabilities=["hicache-host-reserve-env", "hicache-host-reserve-env"], inventory_digest="0" * 64)
    rt = desc.runtime_facts("img:/etc/escha/runtime.json")
    assert rt.sglang_release_source == Provenance(kind="runtime_description", where="img:/etc/escha/runtime.json")
    assert rt.capability_names() == ["hicache-host-reserve-env"]
    assert choose_release(image=rt.release_claim()).source == "img:/etc/escha/runtime.json"
    require_capabilities(rt.capability_names(), ["hicache-host-reserve-env"], "img")
    with pytest.raises(Refused):
        require_capabilities(rt.capability_names(), ["hicache-host-allocator"], "img")
    with pytest.raises(BadInput) as err:
        desc.model_copy(update={"sglang_version": "0.5.19rc1"}).runtime_facts("d.json")
    assert err.value.problems[0].startswith("d.json: sglang_version: "), err.value.problems


@pytest.mark.parametrize("edit, field", [
    # each a value pydantic's lax mode would convert: a number in a string, a whole float, a bool
    (lambda d: d["gpus"][0].update(pci_device_id="11524"), "gpus.0.pci_device_id:"),
    (lambda d: d["gpus"][0].update(memory_total_bytes=float(d["gpus"][0]["memory_total_bytes"])),
     "gpus.0.memory_total_bytes:"),
    (lambda d: d["gpus"][0].update(index="0"), "gpus.0.index:"),
    (lambda d: d["gpus"][1].update(index=True), "gpus.1.index:"),
    (lambda d: d["host"].update(mem_total_bytes=str(d["host"]["mem_total_bytes"])), "host.mem_total_bytes:"),
])
def test_the_facts_file_is_strictly_typed(tmp_path, edit, field):
    doc = json.loads(GOLDEN_BOX.read_text())
    edit(doc)
    p = _write(tmp_path, doc)
    with pytest.raises(BadInput) as err:
        load_facts_file(p)
    assert err.value.problems[0].startswith(f"{p}: {field}"), err.value.problems


def test_a_reports_gpu_inventory_is_strictly_typed(tmp_path):
    p = _report(tmp_path, None)
    doc = json.loads(p.read_text())
    doc["facts"]["gpus"] = {"source": "nvml", "gpus": [{"index": 0, "name": "H200", "vram_bytes": "150000000000"}]}
    p.write_text(json.dumps(doc))
    with pytest.raises(BadInput) as err:
        load_facts_file(p)
    assert err.value.problems[0].startswith(f"{p}: facts.gpus.gpus.0.vram_bytes: "), err.value.problems


def test_the_committed_facts_schema_is_the_models():
    from escha_deploy.facts.file import facts_json_schema
    from escha_deploy.utils.paths import catalog_dir

    committed = json.loads((catalog_dir() / "facts.schema.json").read_text())
    assert committed == facts_json_schema(), "run: python scripts/gen_facts_schema.py"
    # the sections a hand-written file may have, the runtime's included, and host the one required
    assert sorted(committed["properties"]) == sorted(["schema_version", "escha_version", "created_at", "host",
                                                      "findings", "gpus", "runtime"])
    assert committed["required"] == ["host"]
    assert committed["$defs"]["Provenance"]["properties"]["kind"]["enum"][:3] == ["proc", "cgroup", "nvml"]
