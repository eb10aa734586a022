"""First use: `--version` and `profiles show --keys` say what a new user needs, from the
package's own data (the patch series, the profile models, the SGLang 0.5.19 flag catalog)."""

from __future__ import annotations

import json

import pytest
from pydantic import BaseModel

from escha_deploy import __version__
from escha_deploy.sglang.flagcheck import load_catalog
from escha_deploy.utils.paths import runtime_patches_dir
from escha_deploy.profile import list_profiles, load_profile, profile_to_data
from escha_deploy.profile.models import OmitWhenUnset
from escha_deploy.sglang.releases import default_release, supported_releases


def _series_entries() -> list[str]:
    lines = (runtime_patches_dir() / "series").read_text().splitlines()
    return [ln.split("#", 1)[0].strip() for ln in lines if ln.split("#", 1)[0].strip()]


def test_version_names_package_sglang_target_and_patch_series(cli):
    r = cli("--version")
    assert r.code == 0
    lines = r.out.splitlines()
    assert lines[0] == f"escha-deploy {__version__}"
    ordered = sorted(supported_releases(), key=lambda v: tuple(int(x) for x in v.split(".")))
    assert lines[1] == f"SGLang target: {default_release()} (supported: {', '.join(ordered)})"
    assert default_release() == "0.5.19"  # index.yaml's default
    entries = _series_entries()
    assert lines[2].startswith(f"patch series: {len(entries)} patches, sha256 ")
    for name in entries:
        assert any(ln.strip().startswith(name + ":") for ln in lines[3:]), name
    assert "hicache-host-reserve-env" in r.out


def _leaves(data: dict, prefix: str = "") -> set[str]:
    out = set()
    for k, v in data.items():
        out |= _leaves(v, f"{prefix}{k}.") if isinstance(v, dict) else {prefix + k}
    return out


def _omitted_while_unset(model: BaseModel, prefix: str = "") -> set[str]:
    """The keys ``profile_to_data`` leaves out of the data: unset and marked ``OmitWhenUnset``."""
    out = set()
    for name, field in type(model).model_fields.items():
        value = getattr(model, name)
        if isinstance(value, BaseModel):
            out |= _omitted_while_unset(value, f"{prefix}{name}.")
        elif value is None and any(isinstance(m, OmitWhenUnset) for m in field.metadata):
            out.add(prefix + name)
    return out


@pytest.mark.parametrize("name", list_profiles())
def test_profiles_show_keys_covers_every_key(cli, name):
    rows = json.loads(cli("profiles", "show", name, "--keys", "-f", "json").out)
    # a key left out of the data while unset (profile.models.OmitWhenUnset) is still listed
    profile = load_profile(name)
    assert {r["key"] for r in rows} == _leaves(profile_to_data(profile)) | _omitted_while_unset(profile)
    catalog = load_catalog()
    for r in rows:
        # every key states its default; the one key whose default is the empty string gives "" (JSON)
        assert r["unit"] and (r["default"] or r["key"] == "description"), r
        for flag in filter(None, r["sglang_flag"].split(", ")):
            assert flag in catalog.by_option, r  # only flags SGLang 0.5.19's parser has


def test_profiles_show_keys_units_defaults_and_flags(cli):
    rows = {r["key"]: r for r in json.loads(
        cli("profiles", "show", "rtx5060ti-tp2-fp8", "--keys", "-f", "json").out)}
    assert rows["hicache.hicache_ratio"]["sglang_flag"] == "--hicache-ratio"
    assert rows["hicache.hicache_ratio"]["default"] == "auto"
    assert rows["hicache.hicache_size"]["unit"] == "GB (1e9) per rank"
    assert rows["runtime.tp_size"]["sglang_flag"] == "--tp-size"
    assert rows["safety.os_reserve"] == {**rows["safety.os_reserve"], "default": "1GiB", "sglang_flag": ""}
    assert rows["safety.os_reserve"]["unit"].startswith("bytes")
    assert rows["hardware.gpu_count"]["default"] == "required"
    text = cli("profiles", "show", "rtx5060ti-tp2-fp8", "--keys").out
    assert "runtime.tp_size = 2  (default 1; whole number)  [--tp-size]" in text
