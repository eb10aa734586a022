"""Rules that need only the profile are checked when it loads: `profiles validate` (and every
command that loads a profile) names each as ``file:line: key: message`` and exits 2. One test
per rule, each on a real profile file that extends a shipped profile."""

from __future__ import annotations

import subprocess
import sys

import pytest

from escha_deploy.utils.errors import BadInput
from escha_deploy.profile import load_profile

RULES = [
    # (YAML body under `extends: rtx5060ti-tp2-fp8`, the key, its line, a phrase of the message)
    ("runtime:\n  tp_size: 4\n", "runtime.tp_size", 4, "larger than hardware.gpu_count 2"),
    ("runtime:\n  kv_cache:\n    dtype: nvfp4\n", "runtime.kv_cache.dtype", 5, "scale tensors"),
    ("hicache:\n  hicache_host_memory_mode: buffer_only\n", "hicache.hicache_host_memory_mode", 4,
     "needs an L3 storage backend"),
    ("hicache:\n  hicache_storage_backend: file\n  storage_dir: null\n", "hicache.l3.dir", 5,
     "the file backend needs a host directory"),
    ("hicache:\n  l3:\n    kind: file\n", "hicache.l3.dir", 5, "the file backend needs a host directory"),
]


def _write(tmp_path, body: str, base: str = "rtx5060ti-tp2-fp8"):
    p = tmp_path / "rule.yaml"
    p.write_text(f"extends: {base}\nname: rule\n{body}")
    return p


@pytest.mark.parametrize("body,key,line,needle", RULES, ids=[r[1] for r in RULES])
def test_profile_only_rule_is_reported_with_file_line(tmp_path, body, key, line, needle):
    p = _write(tmp_path, body)
    with pytest.raises(BadInput) as err:
        load_profile(str(p))
    assert any(m.startswith(f"{p}:{line}: {key}: ") and needle in m for m in err.value.problems), err.value.problems
    r = subprocess.run([sys.executable, "-m", "escha_deploy.cli.main", "profiles", "validate", str(p)],
                       capture_output=True, text=True)
    assert r.returncode == 2, r.stderr
    assert f"{p}:{line}: {key}: " in r.stderr and needle in r.stderr


def test_l3_with_int2_kv_is_reported_on_the_backend_line(tmp_path):
    p = _write(tmp_path, "hicache:\n  hicache_storage_backend: file\n  storage_dir: /tmp/l3\n", base="rtx5060ti-tp2")
    with pytest.raises(BadInput) as err:
        load_profile(str(p))
    assert any(m.startswith(f"{p}:4: hicache.l3.kind: ") and "scales/zeros" in m
               for m in err.value.problems), err.value.problems


def test_a_set_override_is_named_as_such():
    with pytest.raises(BadInput) as err:
        load_profile("rtx5060ti-tp2-fp8", ["hicache.hicache_host_memory_mode=buffer_only"])
    assert any(m.startswith("--set hicache.hicache_host_memory_mode") for m in err.value.problems), err.value.problems


def test_shipped_profiles_pass():
    r = subprocess.run([sys.executable, "-m", "escha_deploy.cli.main", "profiles", "validate"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


# Keys that load but do nothing: a warning (exit 0), never an error.
L3_OFF = "hicache:\n  storage_dir: /nonexistent/l3\n  storage_max_size: 100GB\n"


def test_l3_keys_without_a_backend_warn_in_validate_and_plan(tmp_path, cli):
    import json

    p = _write(tmp_path, L3_OFF)
    warnings: list[str] = []
    load_profile(str(p), warnings=warnings)
    assert warnings == [f"{p}:4: hicache.storage_dir: no hicache_storage_backend, so L3 is off and storage_dir "
                        "and storage_max_size are ignored; write `l3: {kind: file, dir: DIR}` to use them as "
                        "the L3 file store"]
    r = cli("profiles", "validate", str(p))
    assert (r.code, r.out) == (0, f"ok: {p}\n")
    assert r.err == f"warning: {warnings[0]}\n"
    plan = cli("plan", "-p", str(p), "--host-ram", "64GiB", "--linux", "-f", "json")
    assert plan.code == 0, plan.err
    assert any(w.startswith("hicache.storage_dir: no hicache_storage_backend, so L3 is off")
               for w in json.loads(plan.out)["warnings"])
    table = cli("plan", "-p", str(p), "--host-ram", "64GiB", "--linux")
    assert "warning: hicache.storage_dir: no hicache_storage_backend" in " ".join(table.out.split())


def test_l3_keys_with_another_backend_or_with_file_or_hicache_off(tmp_path):
    warnings: list[str] = []
    load_profile("rtx5060ti-tp2-fp8", ["hicache.storage_max_size=1GB", "hicache.hicache_storage_backend=mooncake"],
                 warnings=warnings)
    assert warnings == ["--set hicache.hicache_storage_backend: read hicache_storage_backend as l3.kind: "
                        "write `l3: {kind: mooncake}` instead",
                        "--set hicache.storage_max_size: storage_max_size is ignored: it configures the file L3 "
                        "backend only, and hicache_storage_backend is mooncake"]
    for quiet in (["hicache.hicache_storage_backend=file"], ["hicache.enabled=false"]):
        warnings = []
        load_profile(str(_write(tmp_path, L3_OFF)), quiet, warnings=warnings)
        assert not [w for w in warnings if "ignored" in w], quiet
    warnings = []
    load_profile("linux-tp2-l3", warnings=warnings)  # the shipped L3 profile sets the backend
    assert warnings == []


def test_a_cross_field_problem_names_the_set_it_came_from():
    # the file backend set on the command line, the directory left unset by the shipped profiles:
    # the --set is named with its value, not the parent file's hicache: section line
    with pytest.raises(BadInput) as err:
        load_profile("rtx5060ti-tp2-fp8", ["hicache.hicache_storage_backend=file"])
    assert err.value.problems == (
        "--set hicache.hicache_storage_backend=file: hicache.l3.dir: the file backend needs a host "
        "directory (it must outlive the container): set hicache.l3.dir",)
    # a --set of the key itself is named alone
    with pytest.raises(BadInput) as err:
        load_profile("rtx5060ti-tp2-fp8", ["hicache.hicache_storage_backend=file", "hicache.storage_dir="])
    assert err.value.problems[0].startswith("--set hicache.storage_dir: the file backend needs")
    # the parent (gpu_count 2) against a --set runtime.tp_size=4
    with pytest.raises(BadInput) as err:
        load_profile("rtx5060ti-tp2-fp8", ["runtime.tp_size=4"])
    assert err.value.problems == ("--set runtime.tp_size: tp_size 4 is larger than hardware.gpu_count 2",)


def test_a_cross_field_problem_names_the_childs_line_not_the_parents(tmp_path):
    # the child sets the backend (line 4); storage_dir is set nowhere: the child's line, not the
    # shipped parent's hicache: line
    p = _write(tmp_path, "hicache:\n  hicache_storage_backend: file\n")
    with pytest.raises(BadInput) as err:
        load_profile(str(p))
    assert err.value.problems == (f"{p}:4: hicache.l3.dir: the file backend needs a host directory (it must "
                                  "outlive the container): set hicache.l3.dir",)
    # the child lowers hardware.gpu_count under the parent's tp_size 2: the child's line
    p = _write(tmp_path, "hardware:\n  gpu_count: 1\ncontainer:\n  gpus: all\n")
    with pytest.raises(BadInput) as err:
        load_profile(str(p))
    assert err.value.problems == (f"{p}:4: runtime.tp_size: tp_size 2 is larger than hardware.gpu_count 1",)


# --------------------------------------------------------------------------- the L3 variant


def test_the_flat_l3_keys_are_read_into_the_variant_with_one_warning(tmp_path):
    flat = _write(tmp_path, "hicache:\n  hicache_storage_backend: file\n  storage_dir: /srv/l3\n"
                            "  storage_max_size: 100GB\n")
    warnings: list[str] = []
    prof = load_profile(str(flat), warnings=warnings)
    assert prof.hicache.l3.model_dump() == {"kind": "file", "dir": "/srv/l3", "max_size": 100 * 10**9,
                                            "min_free_space": None}
    assert warnings == [f"{flat}:4: hicache.hicache_storage_backend: read hicache_storage_backend as l3.kind and "
                        "storage_dir as l3.dir and storage_max_size as l3.max_size: write "
                        "`l3: {kind: file, dir: DIR, max_size: SIZE}` instead"]
    variant = tmp_path / "variant.yaml"
    variant.write_text("extends: rtx5060ti-tp2-fp8\nname: rule\nhicache:\n  l3: {kind: file, dir: /srv/l3, "
                       "max_size: 100GB}\n")
    warnings = []
    assert load_profile(str(variant), warnings=warnings).hicache.model_dump() == prof.hicache.model_dump()
    assert warnings == []


def test_a_set_of_a_flat_key_edits_the_variant_of_a_shipped_profile():
    prof = load_profile("linux-tp2-l3", ["hicache.storage_dir=/srv/other"])
    assert prof.hicache.l3.dir == "/srv/other" and prof.hicache.l3.max_size == 512 * 10**9
    assert load_profile("linux-tp2-l3", ["hicache.l3.dir=/srv/other"]).hicache.model_dump() == prof.hicache.model_dump()
    assert load_profile("linux-tp2-l3", ["hicache.hicache_storage_backend=null"]).hicache.l3 is None


def test_mooncake_settings_reach_the_server_environment():
    """``l3: {kind: mooncake, master, global_segment_size}`` renders the two variables SGLang's
    Mooncake store reads (``mooncake_store.py``: MOONCAKE_MASTER, MOONCAKE_GLOBAL_SEGMENT_SIZE, a
    plain number of bytes), and ``master`` is marked as an address."""
    from escha_deploy.pipeline.argv import server_args, server_env
    from escha_deploy.facts.machine import described_host
    from escha_deploy.planner import plan

    prof = load_profile("rtx5060ti-tp2-fp8", ["hicache.l3={kind: mooncake, master: '127.0.0.1:50051', "
                                              "global_segment_size: 4GiB}"])
    assert prof.hicache.hicache_storage_backend == "mooncake" and prof.hicache.storage_dir is None
    p = plan(prof, described_host(128 * 2**30, "linux"))
    env = server_env(p, prof)
    assert (env["MOONCAKE_MASTER"], env["MOONCAKE_GLOBAL_SEGMENT_SIZE"]) == ("127.0.0.1:50051", str(4 * 2**30))
    args = server_args(p, prof)
    assert args[args.index("--hicache-storage-backend") + 1] == "mooncake"
    master = type(prof.hicache.l3).model_fields["master"]
    assert any(getattr(m, "url", False) for m in master.metadata)


def test_a_bad_l3_kind_is_one_line_naming_the_key(tmp_path):
    p = _write(tmp_path, "hicache:\n  l3:\n    kind: tape\n")
    with pytest.raises(BadInput) as err:
        load_profile(str(p))
    assert len(err.value.problems) == 1 and err.value.problems[0].startswith(f"{p}:4: hicache.l3")
