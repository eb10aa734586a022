"""The launch spec records the plan's figures for SGLang's pre-flight sizing stages (KV cache
configurator, host pools; ``launch_spec.PreflightFigures``), in its digest, so ``serve --spec``
runs all five stages; a spec written before they were recorded still serves, with the two
stages said skipped. No Docker, no SGLang: the stages themselves run in
tests/launch/test_sglang_preflight_image.py."""

from __future__ import annotations

import json

import pytest

from escha_deploy.utils.errors import Refused
from escha_deploy.launch.prepare import prepare
from escha_deploy.launch.serve import read_spec, sglang_preflight
from escha_deploy.launch.sglang_preflight import PREFLIGHT_ENV, device_figures, spec_device
from escha_deploy.pipeline.spec import launch_digest, spec_json


@pytest.fixture(scope="module")
def prep():
    # no Docker client: the plan assumes the image provides the profile's needs
    return prepare("rtx5060ti-tp2-fp8", ["container.gpus=[]"], client=None, need_image=False)


def test_the_spec_carries_the_plans_figures_in_its_digest(prep, tmp_path):
    spec = prep.launch
    dev = spec_device(spec.preflight)
    assert dev is not None
    # the figures native `serve` and `up`'s check take from the plan, plus the plan's host budget
    assert {k: dev[k] for k in ("free_before_weights", "weights", "capability")} == device_figures(prep.plan)
    assert dev["capability"] == "12.0"  # the card's, for the model-runner stage (hardware.compute_capability)
    rc = prep.plan.runtime_check
    reserve = rc.patched_reserve_bytes if rc.applies == "patched" else rc.stock_reserve_bytes
    assert dev["host_budget"] == rc.available_bytes - reserve > 0
    assert spec.plan_digest == launch_digest(spec.profile_data, spec.facts, spec.argv, spec.env, spec.preflight)
    assert spec.plan_digest != launch_digest(spec.profile_data, spec.facts, spec.argv, spec.env)
    # a figure edited after planning: the digest no longer matches
    data = json.loads(spec_json(spec))
    data["preflight"]["weights_bytes"] += 1
    (tmp_path / "edited.json").write_text(json.dumps(data))
    with pytest.raises(Refused, match="plan_digest does not match"):
        read_spec(tmp_path / "edited.json")


def test_a_spec_without_the_figures_serves_with_the_two_stages_skipped(prep, tmp_path, monkeypatch):
    data = json.loads(spec_json(prep.launch))
    del data["preflight"]  # as an escha-deploy before the figures were recorded wrote it
    old = prep.launch.model_validate(data)
    data["plan_digest"] = launch_digest(old.profile_data, old.facts, old.argv, old.env)
    (tmp_path / "old.json").write_text(json.dumps(data))
    spec = read_spec(tmp_path / "old.json")
    assert spec.preflight is None and spec_device(spec.preflight) is None
    lines: list[str] = []
    monkeypatch.setenv(PREFLIGHT_ENV, "1")
    # an interpreter that is not there: the pre-flight says what it skips, then that it did not run
    argv = [str(tmp_path / "no-python"), "-m", "sglang.launch_server", *spec.argv[3:]]
    sglang_preflight(spec, argv, {}, lambda level, msg: lines.append(msg), spec_device(spec.preflight))
    skipped = [ln for ln in lines if "skipped" in ln]
    assert skipped == ["serve: SGLang's pre-flight: KV cache configurator and host pools skipped (the launch spec "
                       "records no pre-flight figures: written by an escha-deploy before they were recorded)"], lines
    assert any("did not run: no interpreter" in ln for ln in lines), lines
