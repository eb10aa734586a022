"""Capability names agree everywhere they are used."""

from pathlib import Path

from escha_deploy.sglang import capabilities as caps
from escha_deploy.profile import Container, list_profiles, load_profile

ROOT = Path(__file__).resolve().parents[1]


def test_capability_names_and_sources():
    assert caps.SERIES_CAPABILITIES == ("hicache-host-reserve-env", "hicache-host-allocator",
                                        "transfer-geometry-check", "hicache-host-mamba-slots")
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
    assert caps.ENV_HOST_MAMBA_SLOTS in (hooks / "host_mamba_slots.py").read_text()
    assert caps.CAPABILITIES["hicache-host-mamba-slots"].env == (caps.ENV_HOST_MAMBA_SLOTS,)


def test_profiles_run_the_image_build_tags_for_the_release_they_plan():
    """Unset, container.image is the tag `escha-deploy build --hicache` gives the image of the
    release the profile plans, and runtime.base_image that release's SGLang image: a shipped
    profile moved to another release with runtime.sglang_version runs that release's image."""
    from escha_deploy.sglang.releases import default_release, image_tag, official_image, supported_releases

    assert Container().image == image_tag("hicache") == f"escha-sglang:{default_release()}-hicache"
    for release in supported_releases():
        assert image_tag("hicache", release) == f"escha-sglang:{release}-hicache"
        assert image_tag("stock", release) == f"escha-sglang:{release}-stock"
        for name in list_profiles():
            p = load_profile(name, [f"runtime.sglang_version={release}"])
            assert (p.container.image, p.runtime.base_image) == (image_tag("hicache", release), official_image(release))
            assert official_image(release) == f"lmsysorg/sglang:v{release}"
    for name in list_profiles():
        p = load_profile(name)
        assert (p.container.image, p.runtime.base_image) == (image_tag("hicache"), official_image())
        # a profile that names its image keeps it, whatever its release
        named = load_profile(name, ["container.image=mine:1", "runtime.base_image=base:2",
                                    f"runtime.sglang_version={supported_releases()[-1]}"])
        assert (named.container.image, named.runtime.base_image) == ("mine:1", "base:2")
    build = (ROOT / "escha_deploy" / "cli" / "build.py").read_text()
    assert 'image_tag("hicache" if hicache else "stock", release, built=built)' in build


def test_shipped_profile_names():
    assert list_profiles() == ["linux-tp2-l3", "rtx5060ti-tp2", "rtx5060ti-tp2-fp8", "rtx5090-tp2-mtp3-l3"]
    import yaml

    compose = yaml.safe_load((ROOT / "compose.yaml").read_text())
    assert compose["services"]["sglang"]["command"] == ["--profile", "rtx5060ti-tp2-fp8"]
