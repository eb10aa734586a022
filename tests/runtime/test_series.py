"""The series against the real sglang 0.5.19 wheel: it applies cleanly, patched files compile,
hooks are carried byte for byte, capabilities are declared, rejects name patch and file."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from escha_deploy.sglang.capabilities import SERIES_CAPABILITIES
from escha_deploy.utils.errors import BadInput, Refused
from escha_deploy.runtime import inventory as inv
from escha_deploy.runtime import patching
from tests.script_module import load_script
from escha_deploy.runtime.series import (
    apply_series,
    capabilities_of,
    parse_patch,
    read_series,
    touched_paths,
)

REPO = Path(__file__).resolve().parents[2]
HOOKS = REPO / "escha_deploy" / "runtime" / "hooks"
HOOK_COPIES = {
    "srt/mem_cache/pool_host/escha_host_reserve.py": HOOKS / "host_reserve.py",
    "srt/mem_cache/pool_host/escha_host_alloc.py": HOOKS / "host_alloc.py",
    "srt/mem_cache/pool_host/escha_transfer_geometry.py": HOOKS / "transfer_geometry.py",
    "srt/mem_cache/pool_host/escha_host_mamba_slots.py": HOOKS / "host_mamba_slots.py",
}


def _series():
    return read_series(patching.series_dir())


def test_series_declares_exactly_our_capabilities():
    patches = _series()
    assert [p.name for p in patches] == [
        "0001-hicache-host-reserve.patch",
        "0002-hicache-host-allocator.patch",
        "0003-transfer-geometry-check.patch",
        "0004-hicache-host-mamba-slots.patch",
    ]
    assert capabilities_of(patches) == list(SERIES_CAPABILITIES)
    for p in patches:
        for key in ("Subject", "Capabilities", "Upstream", "Hook"):
            assert p.header.get(key), (p.name, key)


@pytest.mark.wheel
def test_series_applies_cleanly_and_hooks_are_byte_copies(sglang_wheel):
    contents = apply_series(_series(), lambda rel: inv.read_wheel_file(sglang_wheel, rel))
    assert sorted(contents) == sorted([
        "srt/mem_cache/hybrid_cache/hybrid_pool_assembler.py",
        "srt/mem_cache/pool_host/base.py",
        "srt/mem_cache/pool_host/common.py",
        "srt/mem_cache/pool_host/mamba.py",
        *HOOK_COPIES,
    ])
    for rel, src in HOOK_COPIES.items():
        assert contents[rel] == src.read_bytes(), f"{rel} differs from {src}: regenerate the patch"


@pytest.mark.wheel
def test_every_patched_file_compiles(sglang_wheel):
    contents = apply_series(_series(), lambda rel: inv.read_wheel_file(sglang_wheel, rel))
    for rel, data in contents.items():
        compile(data, f"sglang/{rel}", "exec", dont_inherit=True)


@pytest.mark.wheel
def test_committed_deltas_match_a_fresh_computation(sglang_wheel):
    deltas, _ = patching.compute_deltas(_series(),
                                        lambda rel: inv.read_wheel_file(sglang_wheel, rel))
    committed = json.loads((patching.series_dir() / "deltas.json").read_text())
    assert committed["deltas"] == {k: list(v) for k, v in sorted(deltas.items())}


@pytest.mark.wheel
def test_changed_context_rejects_naming_patch_and_file(sglang_wheel):
    def read(rel):
        data = inv.read_wheel_file(sglang_wheel, rel)
        if rel == "srt/mem_cache/pool_host/mamba.py":
            data = data.replace(b"        _is_cuda = is_cuda()", b"")
            data = data.replace(b"f\"size of the hierarchical cache.\"", b"f\"size.\"")
        return data

    with pytest.raises(Refused) as exc:
        apply_series(_series(), read)
    assert "0001-hicache-host-reserve.patch" in exc.value.message
    assert "sglang/srt/mem_cache/pool_host/mamba.py" in exc.value.message
    assert "hunk #2" in exc.value.message


def test_new_file_over_existing_is_refused():
    p = parse_patch(b"Capabilities:\n--- /dev/null\n+++ b/sglang/x.py\n@@ -0,0 +1 @@\n+a\n",
                    "9000-x.patch", "overlay")
    with pytest.raises(Refused, match="9000-x.patch: sglang/x.py: creates a file"):
        apply_series([p], lambda rel: b"already\n")


def test_offset_hunk_applies_and_no_newline_marker():
    diff = (b"Capabilities:\n--- a/sglang/m.py\n+++ b/sglang/m.py\n@@ -2,2 +2,2 @@\n"
            b" b\n-c\n\\ No newline at end of file\n+C\n\\ No newline at end of file\n")
    p = parse_patch(diff, "9001-y.patch", "overlay")
    # two lines inserted above: the hunk is found at an offset, context matched exactly
    out = apply_series([p], lambda rel: b"x\ny\na\nb\nc")
    assert out["m.py"] == b"x\ny\na\nb\nC"


@pytest.mark.parametrize("text, match", [
    (b"Subject: x\n--- a/sglang/a.py\n+++ b/sglang/a.py\n@@ -1 +1 @@\n-a\n+b\n", "Capabilities"),
    (b"Capabilities: warp-drive\n--- a/sglang/a.py\n+++ b/sglang/a.py\n@@ -1 +1 @@\n-a\n+b\n",
     "unknown capabilities warp-drive"),
    (b"Capabilities:\n--- a/other/a.py\n+++ b/other/a.py\n@@ -1 +1 @@\n-a\n+b\n", "p.patch:2"),
    (b"Capabilities:\n--- a/sglang/a.py\n+++ b/sglang/a.py\n@@ -1,3 +1 @@\n-a\n+b\n",
     "shorter than its header"),
    (b"Capabilities:\nno diff here\n", "no file changes"),
])
def test_malformed_patches_are_bad_input(text, match):
    with pytest.raises(BadInput, match=match):
        parse_patch(text, "p.patch")


def test_touched_paths():
    assert "srt/mem_cache/pool_host/base.py" in touched_paths(_series())


@pytest.mark.wheel
@pytest.mark.gpu
def test_patched_sglang_functions_called_when_importable(site, tmp_path):
    """Import the patched ``pool_host/base.py`` and call ``host_memory_budget_bytes`` under the
    reserve variable. A GPU test: SGLang's package ``__init__`` needs its whole GPU stack. On the
    CPU development machine (2026-11-30) the import stopped, one install after another, at
    orjson, pybase64, triton, starlette, torchvision, IPython, aiohttp, msgspec, zmq and
    transformers; torchvision has no CPU build for torch 2.13 in that machine's package indexes
    (PyPI's needs CUDA torch), so it cannot run there. Where it runs, a stopped import fails."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device: SGLang's GPU stack cannot import here")
    sd = tmp_path / "state"
    located = inv.locate(site / "sglang")
    patching.apply(located, sd)
    code = (
        "import os, json\n"
        "os.environ['ESCHA_HICACHE_HOST_RESERVE_BYTES'] = '0'\n"
        "try:\n"
        "    import sglang.srt.mem_cache.pool_host.base as b\n"
        "except Exception as e:\n"
        "    print(json.dumps({'stopped': f'{type(e).__name__}: {e}'})); raise SystemExit\n"
        "import psutil\n"
        "print(json.dumps({'reserve': b.HICACHE_HOST_MEMORY_RESERVE_BYTES,"
        " 'budget': b.host_memory_budget_bytes(), 'avail': psutil.virtual_memory().available}))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"}, timeout=600)
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert "stopped" not in out, f"patched sglang does not import here: {out['stopped']}"
    assert out["reserve"] == 0
    assert abs(out["budget"] - out["avail"]) < 2**30


def test_hook_sections_are_what_the_generator_writes():
    """Each patch's hook section is ``scripts/gen_series_hooks.py``'s output for the repo file
    (its ``--check``); rewriting a stale copy changes only that section."""
    gen = load_script("gen_series_hooks")
    assert gen.main(["--check"]) == 0
    patch = (patching.series_dir() / "0002-hicache-host-allocator.patch").read_bytes()
    marker = b"+++ b/sglang/srt/mem_cache/pool_host/escha_host_alloc.py\n"
    head, _, tail = patch.partition(marker)
    stale = head + marker + b"@@ -0,0 +1,1 @@\n+old\n"
    assert gen.regenerate(stale) == patch
