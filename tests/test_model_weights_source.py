"""The weights in the device budget come from the safetensors headers' tensor bytes (dtype x
shape, MTP tensors apart), not the file sizes; `plan` says which source fed the budget
(headers, file sizes, the profile's estimate) and whether the weights are pinned."""

from __future__ import annotations

import json

from checkpoint.conftest import checkpoint, safetensors


def _folder(tmp_path, files: dict[str, bytes]):
    d = tmp_path / "model"
    d.mkdir()
    for name, data in files.items():
        if "/" not in name:
            (d / name).write_bytes(data)
    return d


def test_headers_give_tensor_bytes_with_mtp_apart(tmp_path):
    from escha_deploy.sglang.arch import read_model_dir

    d = _folder(tmp_path, checkpoint())
    facts = read_model_dir(d)
    # BF16 64x32 (4,096 B) + F8_E4M3 32x32 (1,024 B) + BF16 64x32 (4,096 B); mtp BF16 32x16 (1,024 B)
    assert (facts.tensor_bytes, facts.mtp_tensor_bytes) == (4096 + 1024 + 4096, 1024)
    assert facts.safetensors_bytes > facts.tensor_bytes + facts.mtp_tensor_bytes  # headers and padding


def test_a_header_that_does_not_add_up_falls_back_to_file_sizes_and_says_why(tmp_path):
    from escha_deploy.sglang.arch import read_model_dir

    bad = safetensors({"w": ("BF16", [4, 4])}).replace(b'"shape":[4,4]', b'"shape":[4,8]')
    d = _folder(tmp_path, {"config.json": checkpoint()["config.json"], "model.safetensors": bad})
    facts = read_model_dir(d)
    assert facts.tensor_bytes is None and facts.safetensors_bytes == len(bad)
    assert facts.header_note == f"{d / 'model.safetensors'}: safetensors header: tensor 'w' holds 32 bytes but " \
        "BF16 x [4, 8] is 64"


def test_a_header_whose_offsets_run_past_the_file_is_refused_naming_the_file(tmp_path, cli):
    """A tensor whose data_offsets end past the file's data (a truncated shard, or a header that
    lies): dtype x shape agrees with the offsets, so only the check against the file's length
    catches it (safetensors' Metadata::validate, MetadataIncompleteBuffer). The headers are
    refused, naming the file, the tensor and the data the file holds, and the file sizes stand
    in, in read_model_dir; plan refuses the shard (exit 3), as SGLang would fail on it."""
    from escha_deploy.sglang.arch import read_model_dir

    good = safetensors({"w": ("BF16", [4, 4])})  # 32 data bytes
    cut = good[:-16]  # the header still says [0, 32]
    d = _folder(tmp_path, {"config.json": checkpoint()["config.json"], "model.safetensors": cut})
    facts = read_model_dir(d)
    want = (f"{d / 'model.safetensors'}: safetensors header: tensor 'w' has data_offsets [0, 32] past the end "
            "of the file's data (16 bytes)")
    assert facts.tensor_bytes is None and facts.header_note == want
    assert facts.safetensors_bytes == len(cut)
    r = cli("plan", "-p", "rtx5060ti-tp2-fp8", "--host-ram", "16GiB", "--wsl2", "--set", f"model.host_dir={d}",
            "-f", "json")
    assert r.code == 3 and r.out == "" and r.err.splitlines()[0] == (
        f"error: model.host_dir: {d / 'model.safetensors'}: {len(cut)} bytes, shorter than the {len(good)} its "
        "header needs (a partial download or copy?)")


def test_plan_says_which_source_fed_the_budget_and_the_pin(cli, tmp_path):
    est = json.loads(cli("plan", "-p", "rtx5060ti-tp2-fp8", "--host-ram", "16GiB", "--wsl2",
                         "--set", f"model.host_dir={tmp_path / 'none'}", "-f", "json").out)
    assert est["weights_source"] == "estimate" and est["model_pin"].startswith("unpinned")
    d = _folder(tmp_path, checkpoint())
    r = cli("plan", "-p", "rtx5060ti-tp2-fp8", "--host-ram", "16GiB", "--wsl2", "--set", f"model.host_dir={d}")
    text = " ".join(r.out.split())
    assert f"weights: headers (safetensors headers in {d}: 0.00 GB of tensors (dtype x shape; MTP tensors apart: " \
        "0.00 GB) / tp 2); unpinned (no escha-model.lock.json in" in text, text
    assert "safetensors headers (tensor bytes)" in r.out  # the table's weights row
    data = json.loads(cli("plan", "-p", "rtx5060ti-tp2-fp8", "--host-ram", "16GiB", "--wsl2",
                          "--set", f"model.host_dir={d}", "-f", "json").out)
    assert data["per_rank"]["weights_bytes"] == (4096 + 1024 + 4096) // 2
    (d / "model-00001-of-00002.safetensors").write_bytes(b"\xff" * 8)  # not a safetensors file
    fs = json.loads(cli("plan", "-p", "rtx5060ti-tp2-fp8", "--host-ram", "16GiB", "--wsl2",
                        "--set", f"model.host_dir={d}", "-f", "json").out)
    assert fs["weights_source"] == "file sizes"
    shard = d / "model-00001-of-00002.safetensors"
    assert f"(the headers: {shard}: not a safetensors file (header length " in fs["weights_source_detail"]


def test_plan_chart_title_names_the_weights_source(tmp_path):
    from escha_deploy.pipeline.chart import weights_words
    from escha_deploy.planner.result import Plan

    fields = {"weights_source": "headers", "model_pin": "pinned a/b@0123456789ab (x)"}
    assert weights_words(Plan.model_construct(**fields)) == "the safetensors headers, pinned a/b@0123456789ab"
    assert weights_words(Plan.model_construct(weights_source="estimate", model_pin="")) == \
        "the profile's estimate, unpinned"
