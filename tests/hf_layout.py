"""A Hugging Face cache made as huggingface_hub makes it (https://huggingface.co/docs/huggingface_hub/guides/manage-cache):
``HUB/models--ORG--NAME/{blobs/HASH, refs/main, snapshots/REV/FILE -> ../../blobs/HASH}``, with
real relative symbolic links, several revisions sharing blobs, and a small valid checkpoint
(config.json, one sharded safetensors model with its index)."""

from __future__ import annotations

import hashlib
import json
import os
import struct
from pathlib import Path

#: A tiny Llama, as config.json says it (bf16 weights).
CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": 2,
          "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64, "hidden_size": 256,
          "torch_dtype": "bfloat16"}


def safetensors(tensors: dict[str, tuple[str, list[int]]]) -> bytes:
    """A safetensors file: 8-byte little-endian header length, the JSON header, the data."""
    size = {"BF16": 2, "F16": 2, "F32": 4, "I8": 1, "U8": 1}
    header, offset = {}, 0
    for name, (dtype, shape) in tensors.items():
        n = size[dtype]
        for d in shape:
            n *= d
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw + bytes(offset)


def checkpoint_files(dtype: str = "BF16") -> dict[str, bytes]:
    """config.json, two shards and the index naming them."""
    shards = {"model-00001-of-00002.safetensors": safetensors({"a.weight": (dtype, [64, 256])}),
              "model-00002-of-00002.safetensors": safetensors({"b.weight": (dtype, [32, 256])})}
    index = {"metadata": {"total_size": 64 * 256 * 2 + 32 * 256 * 2},
             "weight_map": {"a.weight": "model-00001-of-00002.safetensors",
                            "b.weight": "model-00002-of-00002.safetensors"}}
    return {"config.json": json.dumps(CONFIG).encode(), **shards,
            "model.safetensors.index.json": json.dumps(index).encode()}


def hf_cache(hub: Path, repo: str = "escha-test/tiny", revisions: dict[str, dict[str, bytes]] | None = None) -> Path:
    """Make the cache under ``hub``; returns the repository folder. ``revisions``: commit ->
    files (default: two commits of ``checkpoint_files``, the second with another config)."""
    if revisions is None:
        second = dict(checkpoint_files())
        second["config.json"] = json.dumps({**CONFIG, "num_hidden_layers": 3}).encode()
        revisions = {"a" * 40: checkpoint_files(), "b" * 40: second}
    root = hub / ("models--" + repo.replace("/", "--"))
    (root / "blobs").mkdir(parents=True, exist_ok=True)
    (root / "refs").mkdir(exist_ok=True)
    for commit, files in revisions.items():
        snap = root / "snapshots" / commit
        snap.mkdir(parents=True, exist_ok=True)
        for name, data in files.items():
            blob = root / "blobs" / hashlib.sha256(data).hexdigest()
            blob.write_bytes(data)
            link = snap / name
            link.parent.mkdir(parents=True, exist_ok=True)
            os.symlink(os.path.relpath(blob, link.parent), link)
        (root / "refs" / "main").write_text(commit)
    return root


def snapshot(root: Path, commit: str = "a" * 40) -> Path:
    return root / "snapshots" / commit
