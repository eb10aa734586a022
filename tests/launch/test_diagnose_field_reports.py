"""Field reports, round four: what dies after "ready", what the driver says, advice that fits the box.

- Each new row against every supported release's wheel (``escha_deploy/catalog/releases/index.yaml``):
  the format string read out of that release's file and rendered, or, where the wheel prints no
  string (bare asserts), the wheel's own function run until it raises, its real traceback; kernel
  and CUDA lines that no wheel prints are quoted from the public report (test_diagnose_table.py's
  ``QUOTES``).
- The logs rebuilt from each report's quoted lines (``tests/launch/fixtures/diagnose-reports.yaml``),
  through the CLI and the table: each names its row, conclusively (exit 0).
- Advice that fits the box: for every row and every shipped profile's rendered launch (Linux and
  WSL2), no printed fix names a flag, an environment setting or a container setting the launch
  already has; and each fix names something that changes the outcome.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
import textwrap
import traceback
import types
import zipfile
from pathlib import Path

import pytest
import yaml

from escha_deploy.pipeline import argv as flags
from escha_deploy.sglang import releases
from escha_deploy.facts.machine import described_host
from escha_deploy.launch.diagnose import (SIGNATURES, Facts, diagnose, fix_for, launch_facts, launch_settings)
from escha_deploy.pipeline.spec import CONTAINER_JIT_CACHE, build_launch_spec, jit_cache_volume
from escha_deploy.planner import plan
from escha_deploy.profile import list_profiles, load_profile
from escha_deploy.utils.units import GiB

ROOT = Path(__file__).resolve().parents[2]
REPORTS = ROOT / "tests" / "launch" / "fixtures" / "diagnose-reports.yaml"
TS = "[2026-12-01 10:00:00 TP0] "
HOSTS = {"linux": described_host(128 * GiB, "linux"), "wsl2": described_host(32 * GiB, "wsl2")}


def _wheel(version: str) -> zipfile.ZipFile:
    """The release's wheel (CI downloads every supported release's into .cache/wheels; the
    default release's is ``$ESCHA_SGLANG_WHEEL``), or skip."""
    env = os.environ.get("ESCHA_SGLANG_WHEEL")
    if version == releases.default_release() and env and Path(env).is_file():
        return zipfile.ZipFile(env)
    found = sorted((ROOT / ".cache" / "wheels").glob(f"sglang-{version}-*.whl"))
    if not found:
        pytest.skip(f"no sglang {version} wheel under .cache/wheels")
    return zipfile.ZipFile(found[0])


def _source(z: zipfile.ZipFile, path: str) -> str:
    return z.read(f"sglang/srt/{path}").decode()


def _function(src: str, name: str) -> ast.FunctionDef:
    found = [n for n in ast.walk(ast.parse(src)) if isinstance(n, ast.FunctionDef) and n.name == name]
    assert len(found) == 1, name
    return found[0]


def _render(node: ast.AST, sample) -> str:
    """A string literal or f-string as it prints: each ``{expr}`` replaced by ``sample(expr)``."""
    if isinstance(node, ast.Constant):
        return str(node.value)
    assert isinstance(node, ast.JoinedStr), ast.dump(node)
    out = []
    for v in node.values:
        if isinstance(v, ast.Constant):
            out.append(str(v.value))
        else:
            assert isinstance(v, ast.FormattedValue)
            out.append(sample(ast.unparse(v.value)))
    return "".join(out)


def _ids(lines, **facts) -> list[str]:
    return [m.id for m in diagnose(lines, Facts(**facts)).matches]


RELEASES = releases.supported_releases()


# --- the rows against each release's wheel --------------------------------------------------------------


@pytest.mark.wheel
@pytest.mark.parametrize("version", RELEASES)
def test_hash_extension_row_against_the_wheel(version):
    """native_hash.py's RuntimeError, as that release raises it; and what the row says the
    extension needs is what that release's loader asks for: hash_binding.cpp includes
    <openssl/sha.h>, the build links -lcrypto."""
    z = _wheel(version)
    src = _source(z, "mem_cache/cpp_utils/native_hash.py")
    fn = _function(src, "_load_native_hash_module")
    raised = [n.exc for n in ast.walk(fn) if isinstance(n, ast.Raise) and isinstance(n.exc, ast.Call)
              and ast.unparse(n.exc.func) == "RuntimeError" and n.exc.args]
    messages = [_render(r.args[0], str) for r in raised]
    msg = next(m for m in messages if "native hash extension" in m)
    assert "-lcrypto" in ast.unparse(fn)
    assert "#include <openssl/sha.h>" in _source(z, "mem_cache/cpp_utils/hash_binding.cpp")
    log = [TS + "Scheduler hit an exception: Traceback (most recent call last):", f"RuntimeError: {msg}"]
    d = diagnose(log, Facts(exit_code=1))
    assert [m.id for m in d.matches] == ["hicache-hash-extension"] and d.conclusive
    assert "<openssl/sha.h>" in d.matches[0].explanation and "libssl-dev" in d.matches[0].fix


@pytest.mark.wheel
@pytest.mark.parametrize("version", RELEASES)
def test_host_register_row_against_the_wheel(version):
    """_cuda_host_register's RuntimeError rendered with PR #39744's numbers; the chunk variable
    is that release's (GiB: the code multiplies it by 1024**3; default 256), the name flags.py
    renders."""
    z = _wheel(version)
    src = _source(z, "mem_cache/pool_host/common.py")
    fn = _function(src, "_cuda_host_register")
    call = next(n.exc for n in ast.walk(fn) if isinstance(n, ast.Raise) and isinstance(n.exc, ast.Call)
                and "cudaHostRegister failed" in ast.unparse(n.exc))
    sample = {"rc": "1", "offset": "0"}

    def value(expr: str) -> str:
        return "invalid argument" if "ErrorString" in expr else sample.get(expr, "34760392704")

    line = "RuntimeError: " + _render(call.args[0], value)
    assert f"envs.{flags.ENV_REGISTER_CHUNK}.get(), 1) * 1024**3" in ast.unparse(fn).replace("1024 ** 3", "1024**3")
    assert re.search(rf"{flags.ENV_REGISTER_CHUNK} = EnvInt\(256\)", _source(z, "environ.py"))
    prof = load_profile("linux-tp2-l3")
    p = plan(prof, HOSTS["linux"])
    facts = Facts(exit_code=1, **launch_facts(p, build_launch_spec(p, prof)))
    d = diagnose([TS + line], facts)
    m = d.matches[0]
    assert m.id == "host-register-failed" and d.conclusive, line
    assert "34760392704 bytes" in m.explanation and "sglang PR #39744" in m.explanation
    buf = max((b for b in p.per_rank.host_buffers if b.allocator == "register"), key=lambda b: b.requested_bytes)
    assert any(f"{buf.requested_bytes:,} B" in e for e in m.evidence)  # the buffer's size, from the plan
    # the launch already unlimits memlock and sets the chunk: the fix says neither, and lowers the pool
    assert "already unlimited" in m.fix and "already registers in calls of at most 16 GiB" in m.fix
    assert f"{flags.ENV_REGISTER_CHUNK}=" not in m.fix and "memlock=-1" not in m.fix
    assert "hicache.hicache_size" in m.fix


@pytest.mark.wheel
@pytest.mark.parametrize("version", RELEASES)
def test_radix_cache_rows_against_the_wheel(version, tmp_path):
    """Both releases build the unified radix tree for hybrid models (registry.py) and never
    construct the older MambaRadixCache; the unified tree's eviction asserts are bare, so the
    row reads their traceback frame: here the wheel's own _remove_leaf_from_parent, run on a
    node its parent does not hold, at its line in the wheel. Where the release still ships
    mamba_radix_cache.py (0.5.19), its two assertion messages, rendered, name the row too."""
    z = _wheel(version)
    names = [n for n in z.namelist() if n.startswith("sglang/srt/") and n.endswith(".py")]
    constructs = [n for n in names if "MambaRadixCache(" in z.read(n).decode(errors="replace")
                  and not n.endswith("mem_cache/mamba_radix_cache.py")]
    assert constructs == []
    assert re.search(r"def _?create_unified_radix_cache\(", _source(z, "mem_cache/registry.py"))
    core = _source(z, "mem_cache/unified_cache/unified_tree_core.py")
    for name in ("_remove_leaf_from_parent", "_should_cascade_evict_component"):
        fn = _function(core, name)
        assert [a for a in ast.walk(fn) if isinstance(a, ast.Assert) and a.msg is None], name
        assert not [r for r in ast.walk(fn) if isinstance(r, ast.Raise)], name
    fn = _function(core, "_remove_leaf_from_parent")
    body = textwrap.dedent(ast.get_source_segment(core, fn, padded=True))
    path = tmp_path / "unified_tree_core.py"
    path.write_text("\n" * (fn.lineno - 1) + body)  # the function at its own line numbers
    ns: dict = {}
    exec(compile(path.read_text(), str(path), "exec"), ns)
    node = types.SimpleNamespace(key=types.SimpleNamespace(child_key=lambda page: ()),
                                 parent=types.SimpleNamespace(children={}), id=7)
    cache = types.SimpleNamespace(components=[], page_size=64, full_host_duplicates={},
                                  _unregister_node=lambda n: None)
    with pytest.raises(AssertionError) as raised:
        ns["_remove_leaf_from_parent"](cache, node)
    tb = "".join(traceback.format_exception(raised.value)).splitlines()
    assert any(f"{path.name}\", line" in x and x.endswith("in _remove_leaf_from_parent") for x in tb), tb
    d = diagnose([TS + "Scheduler hit an exception: " + tb[0], *tb[1:]], Facts(exit_code=1, hicache_enabled=True))
    m = next(m for m in d.matches if m.id == "radix-cache-assert")
    assert m.conclusive and "_remove_leaf_from_parent" in m.explanation
    assert "hicache.enabled: false" in m.fix and "runtime.page_size: 1" in m.fix
    legacy = "sglang/srt/mem_cache/mamba_radix_cache.py"
    if legacy not in z.namelist():
        assert version != "0.5.19"
        return
    src = _source(z, "mem_cache/mamba_radix_cache.py")
    msgs = {_render(a.msg, lambda e: "()" if e == "key" else f"{e}0") for a in ast.walk(ast.parse(src))
            if isinstance(a, ast.Assert) and a.msg is not None}
    for want in ("evict leaf node invalid", "parent does not have child key"):
        text = next(x for x in msgs if x.startswith(want))
        d = diagnose([TS + f"AssertionError: {text}"], Facts(exit_code=1))
        assert [m.id for m in d.matches] == ["radix-cache-assert"] and d.conclusive, text
        assert "older SGLang" in d.matches[0].explanation or "builds before 0.5.19" in d.matches[0].explanation


def test_jit_cache_row_against_a_real_permission_error(tmp_path):
    """CPython's own error when an ordinary user (root without its override capabilities,
    util-linux setpriv, as tests/corpus does) creates FlashInfer's cache folder under a home it
    cannot write; and errno 30 as LLMFlux#124 quotes it."""
    home = tmp_path / "home"
    (home / ".cache").mkdir(parents=True)
    os.chmod(home / ".cache", 0o555)
    code = f"import os; os.makedirs({str(home / '.cache' / 'flashinfer')!r})"
    r = subprocess.run(["setpriv", "--inh-caps=-dac_override,-dac_read_search",
                        "--bounding-set=-dac_override,-dac_read_search", sys.executable, "-c", code],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "PermissionError: [Errno 13] Permission denied" in r.stderr, r.stderr
    d = diagnose(r.stderr.splitlines(), Facts(exit_code=1))
    assert [m.id for m in d.matches] == ["jit-cache-not-writable"]
    assert str(home / ".cache" / "flashinfer") in d.matches[0].explanation
    assert jit_cache_volume("PROFILE") in d.matches[0].fix.replace("escha-PROFILE-jit", "escha-PROFILE-jit")
    quoted = "OSError: [Errno 30] Read-only file system: '/projects/bfmz/minum/llmflux-data/.cache/flashinfer'"
    assert _ids([quoted]) == ["jit-cache-not-writable"]  # Center-for-AI-Innovation/LLMFlux#124
    assert _ids(["PermissionError: [Errno 13] Permission denied: '/models/x/config.json'"]) == []


# --- the logs rebuilt from the reports ----------------------------------------------------------------


def _reports() -> list[dict]:
    return yaml.safe_load(REPORTS.read_text())["cases"]


def _log(case: dict) -> list[str]:
    return case["files"]["server.log"].splitlines()


def _launches():
    """Every shipped profile's rendered launch on a Linux and a WSL2 box: (label, plan, spec)."""
    for name in list_profiles():
        prof = load_profile(name)
        for host, facts in HOSTS.items():
            p = plan(prof, facts)
            yield f"{name}/{host}", p, build_launch_spec(p, prof)


LAUNCHES = list(_launches())


@pytest.mark.parametrize("case", _reports(), ids=lambda c: c["id"])
def test_each_report_names_its_row_conclusively(case, cli, tmp_path):
    """A log on its own, through `escha-deploy diagnose FILE`: exit 0 with the report's row and
    a fix; then the table: the row, proven."""
    for name, text in case["files"].items():
        (tmp_path / name).write_text(text)
    r = cli(*[a.replace("{d}", str(tmp_path)) for a in case["argv"]])
    assert r.code == case["exit"] == 0 and case["fragment"] in r.out and "fix:" in r.out, r.out + r.err
    row = case["fragment"].strip("[]")
    d = diagnose(_log(case), Facts(platform=None))
    assert d.conclusive, d.lines()
    assert row in [m.id for m in d.matches if m.conclusive], d.lines()
    assert case["argv"][0] == "diagnose" and case["exit"] == 0
    if row == "nccl-watchdog-timeout":  # HiCache on (the log's server_args= line): its advice too
        assert "hicache.enabled: false" in d.matches[0].fix


def _settings_named(fix: str, launch: frozenset[str]) -> list[str]:
    """The launch's own settings a fix names: a flag (as a whole word), NAME=VALUE of its
    environment, or a container setting (ipc=host, memlock=-1, stack=...)."""
    named = []
    for s in launch:
        if s.startswith("--"):
            if "=" not in s and re.search(rf"(?<![\w-]){re.escape(s)}(?![\w-])", fix):
                named.append(s)
        elif "=" in s and s in fix:
            named.append(s)
    return named


@pytest.mark.parametrize("label,p,spec", LAUNCHES, ids=[x[0] for x in LAUNCHES])
def test_no_fix_names_what_the_launch_already_sets(label, p, spec):
    """Every row (each variant whose facts hold), and every report's log diagnosed with this
    launch: no printed fix names a flag, environment setting or container setting the launch
    already has."""
    known = launch_facts(p, spec)
    facts = Facts(exit_code=1, **known)
    bad = {}
    for sig in SIGNATURES:
        if sig.holds(facts) is False:
            continue
        named = _settings_named(fix_for(sig, facts), known["launch"])
        if named:
            bad[sig.id] = named
    for case in _reports():
        for m in diagnose(_log(case), facts).matches:
            named = _settings_named(m.fix, known["launch"])
            if named:
                bad[f"{case['id']}:{m.id}"] = named
    assert bad == {}, label


#: Rows whose cause is outside anything a profile key or flag decides, so their fix names none:
#: the hardware, the driver, the Docker daemon or the host, or an event that needs no fix.
OUTSIDE_THE_PROFILE = {
    "gpu-lost": "the card, its power or PCIe link",
    "killed-by-signal": "a stop someone asked for",
    "child-failed": "points at the first error above it",
    "kernel-oom-line": "names the kernel's own line; the memory fix is the OOM rows'",
    "docker-no-gpu-driver": "the host's NVIDIA container toolkit",
    "memlock-rlimit-refused": "the Docker daemon's own limits",
    "wsl-no-gpu-adapter": "the Windows driver and WSL",
    "no-gpu": "the host's driver",
    "docker-daemon-gone": "the daemon",
    "runtime-module-missing": "the image",
    "model-type-missing": "the model's own config.json",
    "model-arch-unknown": "the image's transformers",
    "no-kernel-image": "the image's kernels",
    "torch-arch-unsupported": "the image's torch",
    "ptxas-arch-unknown": "the image's Triton toolchain",
    "address-in-use": "another process holds the port",
    "unauthorized": "the client's key",
    "health-without-generate": "a relaunch on a killed server's ports",
    "killed-line": "unproven; the memory fix is conditional",
    "killed-sigkill": "unproven; the memory fix is conditional",
    "dist-init-unreachable": "the network between the boxes (names the fleet key)",
    "nccl-duplicate-gpu": "names container.gpus",
    "jit-cache-not-writable": "the launch's JIT volume is the fix; past it, the folder's owner",
    "warmup-through-proxy": "the proxy variables of the shell `up` runs from",
}
_CHANGES = re.compile(r"\b(?:runtime|hicache|container|model|hardware|safety)\.[a-z_]+"
                      r"|(?<![\w-])--[a-z][a-z0-9-]+|\b[A-Z][A-Z0-9_]{3,}=\S+")


@pytest.mark.parametrize("label,p,spec", LAUNCHES[:2] + [("unknown", None, None)],
                         ids=[x[0] for x in LAUNCHES[:2]] + ["unknown"])
def test_each_fix_names_what_changes_the_outcome(label, p, spec):
    """A fix names a profile key, a server flag or an environment setting that changes the
    outcome, except for the rows whose cause lies outside the launch (``OUTSIDE_THE_PROFILE``,
    each with its reason)."""
    facts = Facts(exit_code=1, **launch_facts(p, spec)) if p is not None else Facts(exit_code=1, platform=None)
    lacking = sorted({s.id for s in SIGNATURES if s.holds(facts) is not False
                      and not _CHANGES.search(fix_for(s, facts)) and s.id not in OUTSIDE_THE_PROFILE})
    assert lacking == []


# --- the rendered launch --------------------------------------------------------------------------------


def test_the_chunk_is_rendered_only_above_its_size():
    """linux-tp2-l3 registers a 21.3 GB KV buffer per rank (above 16 GiB): its env sets the
    chunk; rtx5060ti-tp2's buffers are below it: its env does not."""
    l3 = load_profile("linux-tp2-l3")
    p = plan(l3, HOSTS["linux"])
    big = max(b.requested_bytes for b in p.per_rank.host_buffers if b.allocator == "register")
    assert big > flags.REGISTER_CHUNK_GIB * GiB
    assert flags.server_env(p, l3)[flags.ENV_REGISTER_CHUNK] == str(flags.REGISTER_CHUNK_GIB)
    small = load_profile("rtx5060ti-tp2")
    q = plan(small, HOSTS["linux"])
    assert all(b.requested_bytes <= flags.REGISTER_CHUNK_GIB * GiB for b in q.per_rank.host_buffers)
    assert flags.ENV_REGISTER_CHUNK not in flags.server_env(q, small)
    sized = load_profile("linux-tp2-l3", ["hicache.hicache_size=10"])
    assert flags.ENV_REGISTER_CHUNK not in flags.server_env(plan(sized, HOSTS["linux"]), sized)


@pytest.mark.parametrize("name", list_profiles())
def test_the_jit_cache_is_a_named_volume_with_the_caches_pointed_at_it(name):
    from escha_deploy.launch.compose import render

    prof = load_profile(name)
    spec = build_launch_spec(plan(prof, HOSTS["linux"]), prof)
    vol = [m for m in spec.container.mounts if m.target == CONTAINER_JIT_CACHE]
    assert [(m.kind, m.source, m.read_only) for m in vol] == [("volume", jit_cache_volume(name), False)]
    env = spec.container.environment
    assert env["FLASHINFER_WORKSPACE_BASE"] == CONTAINER_JIT_CACHE
    assert all(env[k].startswith(CONTAINER_JIT_CACHE) for k in ("TRITON_CACHE_DIR", "TORCH_EXTENSIONS_DIR",
                                                                  "SGLANG_CACHE_DIR"))
    doc = render(spec.container)
    assert doc["volumes"] == {jit_cache_volume(name): {"name": jit_cache_volume(name)}}
    assert "ipc=host" in launch_settings(spec) and "memlock=-1" in launch_settings(spec)


# --- the kernel log and the command ---------------------------------------------------------------------


def test_kernel_log_reads_this_machines_log_or_says_why():
    """The real dmesg (or journalctl -k) of this machine: only GPU lines are kept, and when no
    reader may read the log the reason names each."""
    from escha_deploy.doctor.kernel_log import GPU_LINE, gpu_lines

    lines, how = gpu_lines()
    assert how in ("dmesg", "journalctl -k -b --no-pager -q") or how.startswith("the kernel log could not")
    assert all(GPU_LINE.search(ln) for ln in lines)
    none, why = gpu_lines(readers=[("escha-no-such-reader",), ("false",)])
    assert none == [] and "escha-no-such-reader" in why and "false: exit 1" in why


def _standin_dmesg(folder: Path) -> Path:
    """A stand-in for ``dmesg`` on a box whose driver lost a GPU (no GPU here): a real
    executable printing the lines NVIDIA/open-gpu-kernel-modules#1151 quotes, between
    WSL2's harmless boot-time dxgkrnl line (microsoft/WSL#40715) and an unrelated one."""
    exe = folder / "dmesg"
    exe.write_text("#!/bin/sh\n"
                   "echo '[    1.27] misc dxg: dxgk: dxgkio_query_adapter_info: Ioctl failed: -22'\n"
                   "echo '[  649.39] docker0: port 1(veth02953fd) entered forwarding state'\n"
                   "echo '[ 2012.01] NVRM: Xid (PCI:0000:01:00): 79, GPU has fallen off the bus.'\n")
    exe.chmod(0o755)
    return exe


def test_diagnose_command_reads_the_kernel_log_and_the_profiles_launch(cli, tmp_path, monkeypatch):
    """The server's log has only the CUDA error; --kernel-log finds the Xid in the kernel log
    (here the stand-in dmesg first on PATH) and names the GPU lost, exit 0. --profile renders
    the profile's launch: the host-register fix then says what that launch already does."""
    log = tmp_path / "server.log"
    log.write_text(TS + "Scheduler hit an exception: Traceback (most recent call last):\n"
                   "torch.AcceleratorError: CUDA error: unspecified launch failure\n")
    assert cli("diagnose", str(log)).code == 5
    bindir = tmp_path / "bin"
    bindir.mkdir()
    _standin_dmesg(bindir)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    r = cli("diagnose", str(log), "--kernel-log")
    assert r.code == 0 and "[gpu-lost]" in r.out and "1 GPU line of `dmesg`" in r.out, r.out + r.err
    assert "dxgkio_query_adapter_info" not in r.out
    case = next(c for c in _reports() if c["id"] == "report-host-register-one-large-call")
    log.write_text(case["files"]["server.log"])
    bare = cli("diagnose", str(log))
    assert bare.code == 0 and "renders SGLANG_HICACHE_HOST_REGISTER_CHUNK_GB=16" in bare.out
    fitted = cli("diagnose", str(log), "--profile", "linux-tp2-l3")
    assert fitted.code == 0 and "linux-tp2-l3's launch" in fitted.out
    assert "already registers in calls of at most 16 GiB" in fitted.out and "memlock=-1" not in fitted.out
    assert "host KV buffer (K and V)" in fitted.out  # the plan's buffer, named
    assert cli("diagnose", str(log), "--profile", str(tmp_path / "none.yaml")).code == 2
