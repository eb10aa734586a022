"""Each supported release's Dockerfile.hicache image, through the real Docker daemon: .ci/test
builds one per release beside the default release's (its wheel's layer on the Debian layer the
default base shares, scripts/make-base-image.sh) and names them in ESCHA_TEST_RELEASE_IMAGES
(RELEASE=IMAGE, space-separated). Each holds its release's SGLang with that release's series
(runtime_patches/<release>/), verifies inside and says so in its labels and description; `up`
plans a profile of that release for it with nothing refused; a base that holds another release
is refused by the build, naming both."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from escha_deploy.sglang.releases import default_release, image_tag, series_releases
from escha_deploy.runtime.patching import series_dir
from escha_deploy.runtime.series import capabilities_of, read_series

from .test_build_docker import BASE, _client, _need_image, _run

pytestmark = pytest.mark.docker
REPO = Path(__file__).resolve().parents[2]


def release_images() -> dict[str, str]:
    """``{release: image}`` from ESCHA_TEST_RELEASE_IMAGES (.ci/test sets it)."""
    raw = os.environ.get("ESCHA_TEST_RELEASE_IMAGES", "").split()
    return dict(item.split("=", 1) for item in raw)


def _images() -> dict[str, str]:
    images = release_images()
    if not images:
        pytest.skip("ESCHA_TEST_RELEASE_IMAGES is not set (.ci/test builds each release's image)")
    return images


def test_ci_builds_an_image_for_every_other_release_with_a_series():
    want = [v for v in series_releases() if v != default_release()]
    assert sorted(_images()) == sorted(want)


@pytest.mark.parametrize("release", [v for v in series_releases() if v != default_release()])
def test_the_release_image_holds_its_release_and_its_series(release):
    client = _client()
    image = _images().get(release) or pytest.fail(f"no image of SGLang {release} in ESCHA_TEST_RELEASE_IMAGES")
    labels = _need_image(client, image).labels
    series = read_series(series_dir(release), "series")
    assert labels["io.escha.runtime.sglang-version"] == release
    assert labels["io.escha.runtime.series"] == ",".join(p.name for p in series)
    assert labels["io.escha.runtime.capabilities"] == ",".join(capabilities_of(series))
    verify = _run(image, "escha-deploy", "runtime", "verify", "--format", "json")
    assert verify.returncode == 0, verify.stderr
    assert json.loads(verify.stdout)["ok"]
    desc = json.loads(_run(image, "cat", "/etc/escha/runtime.json").stdout)
    assert desc["sglang_version"] == release and desc["python"].startswith("3.11"), desc
    assert [e["name"] for e in desc["series"]] == [p.name for p in series], desc["series"]
    # each patch as committed for this release, not the default release's file of the same name
    assert [e["sha256"] for e in desc["series"]] == [p.sha256 for p in series], desc["series"]
    assert desc["capabilities"] == capabilities_of(series)
    # the base was checked against the committed inventory of this release's wheel
    assert "committed" in _run(image, "escha-deploy", "runtime", "describe").stdout


@pytest.mark.parametrize("release", [v for v in series_releases() if v != default_release()])
def test_up_plans_a_profile_of_the_release_for_its_image(release, tmp_path):
    """`up`'s pipeline for rtx5060ti-tp2-fp8 moved to ``release``: the image it names unset is
    that release's tag; on this run's image of the release (the same build under a per-run
    tag) the image's label gives the release, its capabilities meet the profile's needs and
    nothing is refused."""
    from escha_deploy.launch.prepare import prepare
    from escha_deploy.profile import load_profile
    from tests.oracle.cases import config_json

    client = _client()
    image = _images()[release]
    _need_image(client, image)
    name = "rtx5060ti-tp2-fp8"
    assert load_profile(name, [f"runtime.sglang_version={release}"]).container.image == image_tag("hicache", release)
    model = tmp_path / "model"  # the profile's model as config.json and a sparse weights file
    model.mkdir()
    (model / "config.json").write_text(json.dumps(config_json(load_profile(name).model.architecture)))
    with open(model / "model.safetensors", "wb") as f:
        f.truncate(load_profile(name).model.weights_total or 64)
    prep = prepare(name, [f"runtime.sglang_version={release}", f"container.image={image}", f"model.host_dir={model}"],
                   client=client, spec_file=str(tmp_path / "spec.json"), need_image=True, image_files=False)
    assert prep.plan.sglang_release == release
    assert prep.image_present is True and not prep.missing_capabilities, prep.missing_capabilities
    assert not {"image", "capabilities", "plan"} & set(prep.refused_by), prep.refused_by
    assert prep.spec.image == image and prep.capabilities_source == f"the image {image}"
    # a 0.5.19-labelled image for a profile of this release: the two releases named, exit 3
    hicache = os.environ.get("ESCHA_TEST_HICACHE_IMAGE")
    if hicache:
        from escha_deploy.utils.errors import Refused

        with pytest.raises(Refused, match=f"says {default_release()}, runtime.sglang_version says {release}"):
            prepare(name, [f"runtime.sglang_version={release}", f"container.image={hicache}",
                           f"model.host_dir={model}"], client=client, image_files=False)


def test_a_base_of_another_release_is_refused_naming_both():
    """`build --sglang-version R` on a base holding the default release: the series of R is
    not applied to it; runtime apply refuses in the build, naming both releases (exit 3). The
    layers before the series step are the default image's, from the cache."""
    client = _client()
    _need_image(client, BASE)
    other = next((v for v in series_releases() if v != default_release()), None) or pytest.skip("one release only")
    tag = f"escha-sglang:ci-mismatch-{os.environ.get('ESCHA_TEST_RUN') or os.getpid()}"
    try:
        proc = subprocess.run(["escha-deploy", "build", "--base-image", BASE, "--sglang-version", other,
                               "--python-version", "3.11", "--tag", tag],
                              capture_output=True, text=True, timeout=900, cwd=REPO)
    finally:
        subprocess.run(["docker", "rmi", "-f", tag], capture_output=True)
    assert proc.returncode == 3, proc.stderr[-2000:]
    assert (f"build argument SGLANG_VERSION='{other}' but the installed sglang at "
            in proc.stderr and f" is {default_release()}" in proc.stderr), proc.stderr[-2000:]
