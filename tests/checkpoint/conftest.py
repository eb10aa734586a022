"""A small checkpoint (real safetensors bytes, the reference profile's config.json) served by
the hub STAND-IN (hub_standin.py) on 127.0.0.1; the client is the unmodified huggingface_hub."""

from __future__ import annotations

import json
import struct

import pytest

from .hub_standin import HubStandin

REPO = "escha-test/tiny-qwen3.5"


def safetensors(tensors: dict[str, tuple[str, list[int]]]) -> bytes:
    """A safetensors file (8-byte little-endian header length, JSON header, data) holding
    ``name: (dtype, shape)`` tensors filled with a pattern."""
    sizes = {"BF16": 2, "F16": 2, "F32": 4, "F8_E4M3": 1, "I32": 4, "U8": 1}
    header, off, data = {}, 0, b""
    for name, (dtype, shape) in tensors.items():
        n = sizes[dtype]
        for d in shape:
            n *= d
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + n]}
        data += (bytes(range(len(name) % 7, 256)) * (n // 249 + 1))[:n]
        off += n
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # the format pads the header to 8 bytes
    return struct.pack("<Q", len(raw)) + raw + data


def checkpoint(big: bool = False) -> dict[str, bytes]:
    """Two shards named by an index (one holds an MTP tensor), config, tokenizer, and files
    SGLang does not need (a .bin copy, a README, a sub-folder)."""
    from escha_deploy.profile import load_profile

    arch = load_profile("rtx5060ti-tp2-fp8").model.architecture.model_dump(mode="json")
    s1 = safetensors({"model.embed_tokens.weight": ("BF16", [64, 32]), "model.layers.0.w": ("F8_E4M3", [32, 32])})
    # big: a 24 MiB shard, more than huggingface_hub's 10 MiB read chunk, so a cut is resumed mid-file
    s2 = safetensors({"lm_head.weight": ("BF16", [3072, 4096] if big else [64, 32]),
                      "mtp.fc.weight": ("BF16", [32, 16])})
    index = {"metadata": {"total_size": 0}, "weight_map": {
        "model.embed_tokens.weight": "model-00001-of-00002.safetensors",
        "model.layers.0.w": "model-00001-of-00002.safetensors",
        "lm_head.weight": "model-00002-of-00002.safetensors",
        "mtp.fc.weight": "model-00002-of-00002.safetensors"}}
    return {"config.json": json.dumps(arch).encode(), "tokenizer.json": b'{"version": "1.0"}',
            "model.safetensors.index.json": json.dumps(index).encode(),
            "model-00001-of-00002.safetensors": s1, "model-00002-of-00002.safetensors": s2,
            "pytorch_model.bin": b"\0" * 300, "README.md": b"# tiny\n", "original/consolidated.pth": b"\0" * 50}


@pytest.fixture
def hub(monkeypatch, tmp_path):
    """The hub stand-in with ``REPO`` on main; HF_ENDPOINT points at it, HF_HOME at a temp folder."""
    h = HubStandin()
    h.add(REPO, checkpoint())
    url = h.start()
    monkeypatch.setenv("HF_ENDPOINT", url)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    yield h
    h.stop()
