"""`up` plans a second time only when doctor's probes measured this host (the facts changed):
that second run of the pipeline reuses the first one's profile and image runtime
(``Prepared.runtime``), so the image is read once, and on unchanged facts it reaches the same
launch. Real dockerd and a real image (CI's test base image, which has no capability label)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.docker


def test_a_second_plan_of_the_same_launch_reads_the_image_once(docker_client, base_image, tmp_path, monkeypatch):
    from escha_deploy.launch import docker as dk
    from escha_deploy.launch.prepare import prepare

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # no saved doctor findings
    read: list[str] = []
    real = dk.image_labels

    def labels(client, image):  # the real daemon's answer, counted
        read.append(image)
        return real(client, image)

    monkeypatch.setattr(dk, "image_labels", labels)
    sets = ["container.gpus=[]", f"container.image={base_image}"]
    first = prepare("rtx5060ti-tp2-fp8", sets, client=docker_client, image_files=False)
    assert read == [base_image]
    assert first.runtime is not None and first.runtime.present is True
    assert first.capabilities_source.startswith("assumed"), first.capabilities_source  # no label on it
    again = prepare("rtx5060ti-tp2-fp8", sets, client=docker_client, profile=first.profile,
                    runtime=first.runtime)
    assert read == [base_image]  # not asked again
    assert again.launch.plan_digest == first.launch.plan_digest
    assert (again.refused_by, again.capabilities_source, again.image_present) == \
        (first.refused_by, first.capabilities_source, first.image_present)
