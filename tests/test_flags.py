"""Every argv rendered for every shipped profile is accepted by SGLang 0.5.19's parser catalog
(generated from the real parser by scripts/gen_flag_catalog.py) plus the flags the profile's
needed capabilities declare; and secrets never reach argv or env."""

import pytest

from escha_deploy.sglang.flagcheck import check_argv
from escha_deploy.pipeline.argv import server_args, server_env
from escha_deploy.facts.machine import described_host
from escha_deploy.pipeline.spec import build_launch_spec
from escha_deploy.planner import plan
from escha_deploy.profile import list_profiles, load_profile
from escha_deploy.utils.units import GiB

HOSTS = {"wsl2-16GiB": described_host(16 * GiB, "wsl2"), "linux-128GiB": described_host(128 * GiB, "linux")}


@pytest.mark.parametrize("host", HOSTS)
@pytest.mark.parametrize("name", list_profiles())
def test_rendered_argv_is_accepted(name, host):
    prof = load_profile(name)
    p = plan(prof, HOSTS[host])
    spec = build_launch_spec(p, prof)
    result = check_argv(spec.argv, set(prof.runtime.needs))
    assert result.ok, result.error_lines()
    declared = {u.capability for u in result.declared()}
    assert declared <= set(prof.runtime.needs)
    if prof.runtime.kv_cache.dtype == "int2":
        assert "int2-kv" in declared


def test_int2_flags_are_not_accepted_without_the_capability():
    prof = load_profile("rtx5060ti-tp2")
    p = plan(prof, HOSTS["wsl2-16GiB"])
    assert not check_argv(build_launch_spec(p, prof).argv, set()).ok


def test_hicache_flags_follow_the_plan():
    prof = load_profile("rtx5060ti-tp2")
    args = server_args(plan(prof, HOSTS["wsl2-16GiB"], ratio=1), prof)
    assert args[args.index("--hicache-ratio") + 1] == "1"
    off = server_args(plan(load_profile("rtx5060ti-tp2-fp8"), described_host(8 * GiB, "wsl2")), load_profile("rtx5060ti-tp2-fp8"))
    assert "--enable-hierarchical-cache" not in off and "--hicache-ratio" not in off
    sized = load_profile("linux-tp2-l3")
    a = server_args(plan(sized, HOSTS["linux-128GiB"]), sized)
    assert a[a.index("--hicache-size") + 1] == "30" and "--hicache-ratio" not in a


def test_env_carries_the_patch_settings():
    prof = load_profile("rtx5060ti-tp2")
    p = plan(prof, HOSTS["wsl2-16GiB"])
    env = server_env(p, prof)
    assert env["ESCHA_HICACHE_HOST_RESERVE_BYTES"] == str(2 * GiB)
    assert env["ESCHA_HICACHE_HOST_ALLOCATOR"] == "pinned"  # WSL2 (seed 000)
    assert env["NCCL_P2P_DISABLE"] == "1"  # GeForce (B18)
    assert "0.0.0.0" in env["NO_PROXY"]  # B30
    stock = plan(prof, HOSTS["wsl2-16GiB"], capabilities=frozenset({"int2-kv", "w2-weights"}))
    assert "ESCHA_HICACHE_HOST_RESERVE_BYTES" not in server_env(stock, prof)


def test_secrets_never_in_argv_env_or_labels(tmp_path):
    key = tmp_path / "key"
    key.write_text("sk-very-secret-123")
    prof = load_profile("rtx5060ti-tp2-fp8", [f"container.api_key_file={key}", "container.expose=true"])
    spec = build_launch_spec(plan(prof, HOSTS["linux-128GiB"]), prof)
    dumped = spec.model_dump_json()
    assert "sk-very-secret-123" not in dumped
    assert "--api-key" not in spec.argv
    assert spec.api_key_file == "/run/secrets/escha_api_key"
    assert spec.container.secret_files == {"/run/secrets/escha_api_key": str(key)}
    assert spec.container.port_host_ip == "0.0.0.0"


def test_loopback_unless_exposed():
    prof = load_profile("rtx5060ti-tp2-fp8")
    spec = build_launch_spec(plan(prof, HOSTS["linux-128GiB"]), prof)
    assert spec.container.port_host_ip == "127.0.0.1"
    native = build_launch_spec(plan(prof, HOSTS["linux-128GiB"]), prof, native=True)
    assert native.argv[native.argv.index("--host") + 1] == "127.0.0.1"


def _bool_flag_keys() -> list[tuple[str, str]]:
    """``(runtime key, its SGLang flag)`` for each boolean runtime key that defaults to off and
    names a flag in its metadata."""
    from escha_deploy.profile import sglang_flag
    from escha_deploy.profile.models import Runtime

    return [(name, meta.flag) for name, info in Runtime.model_fields.items()
            if (meta := sglang_flag(info)) is not None and meta.flag and info.default is False]


@pytest.mark.parametrize(("key", "flag"), _bool_flag_keys())
def test_each_boolean_runtime_key_renders_its_flag(key, flag):
    """A key set in the profile reaches SGLang's argv (enable_int8_mamba_checkpoint never did)."""
    from tests.oracle.cases import _load_unchecked

    prof = _load_unchecked("rtx5060ti-tp2-fp8", ("hicache.enabled=false", f"runtime.{key}=true"))
    assert flag in server_args(plan(prof, HOSTS["linux-128GiB"]), prof)
