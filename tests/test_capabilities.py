"""Capability names agree everywhere they are used."""

from pathlib import Path

from escha_deploy import capabilities as caps
from escha_deploy.profile import Container, list_profiles, load_profile

ROOT = Path(__file__).resolve().parents[1]


def test_capability_names_and_sources():
    assert set(caps.SERIES_CAPABILITIES) == {"hicache-host-reserve-env", "hicache-host-allocator",
                                             "transfer-geometry-check"}
    assert {n for n, c in caps.CAPABILITIES.items() if c.source == "overlay"} == {
        "int2-kv", "w2-weights", "mamba-mixed-chunk-fix"}


def test_patch_series_provides_exactly_our_capabilities():
    provided = set()
    for patch in sorted((ROOT / "runtime_patches").glob("0*.patch")):
        for line in patch.read_text().splitlines():
            if line.startswith("Capabilities:"):
                provided |= {w.strip(" ,") for w in line.split(":", 1)[1].split()}
    assert provided == set(caps.SERIES_CAPABILITIES)


def test_patch_environment_names_in_the_hooks():
    hooks = ROOT / "escha_deploy" / "runtime" / "hooks"
    assert caps.ENV_HOST_RESERVE in (hooks / "host_reserve.py").read_text()
    assert caps.ENV_HOST_ALLOCATOR in (hooks / "host_alloc.py").read_text()


def test_profiles_run_the_image_build_tags():
    assert Container().image == caps.IMAGE_HICACHE
    for name in list_profiles():
        assert load_profile(name).container.image == caps.IMAGE_HICACHE
    assert "IMAGE_HICACHE" in (ROOT / "escha_deploy" / "cli" / "build.py").read_text()


def test_shipped_profile_names():
    assert list_profiles() == ["linux-tp2-l3", "rtx5060ti-tp2", "rtx5060ti-tp2-fp8"]
    import yaml

    compose = yaml.safe_load((ROOT / "compose.yaml").read_text())
    assert compose["services"]["sglang"]["command"] == ["--profile", "rtx5060ti-tp2-fp8"]
