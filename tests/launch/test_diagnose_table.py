"""The diagnosis table, row by row, against the real messages.

Each row with a pattern is tested against the format string in the pinned wheel that prints
it (SGLang 0.5.19 from ``$ESCHA_SGLANG_WHEEL``, transformers 5.12.1 downloaded into
``.cache/wheels`` as .ci/test does, torch 2.13 as installed), read at the file:line the row's
``source`` names and rendered with sample values; or, for kernel, CUDA and NCCL lines that
native code prints, against a line quoted from the public report the row names (``QUOTES``
below, each verbatim with its URL); or against what the real part prints here (CPython's
import and bind errors, docker-py with no daemon behind its socket). No pattern is tested
only against a log written to match it.
"""

from __future__ import annotations

import codecs
import json
import os
import re
import signal
import socket
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from escha_deploy.launch.diagnose import KINDS, SIGNATURES, Facts, diagnose

ROOT = Path(__file__).resolve().parents[2]
TRANSFORMERS = "transformers==5.12.1"

# Lines quoted verbatim from public reports (kernel, CUDA, NCCL and shell lines that no wheel
# here prints as a Python format string).
QUOTES: dict[str, list[tuple[str, str]]] = {
    "jit-toolkit-too-old": [
        ("https://github.com/vllm-project/vllm/pull/31740",
         "(EngineCore_DP0 pid=120) ERROR 01-28 06:36:45 [core.py:946] RuntimeError: No supported CUDA architectures "
         "found for major versions [10]."),
    ],
    "host-map-failed": [
        ("https://github.com/sgl-project/sglang/pull/26301",
         "Cannot map memory with base addr 0x7f134c660000 and size of 0xf179a0 pages"),
    ],
    "killed-line": [
        ("https://github.com/sgl-project/sglang/issues/5096",
         "ERROR 2025-04-05T00:01:19.509514570Z ./entrypoint.sh: line 48: 28 Killed python3 -m "
         "sglang.launch_server --host 0.0.0.0 --port ..."),
        ("https://github.com/equinor/ert/issues/7797", "Killed"),
    ],
    "kernel-oom-line": [
        ("https://github.com/equinor/ert/issues/7797",
         "2024-04-29T14:55:41,679700+02:00 Out of memory: Killed process 1440763 (perl) total-vm:87033376kB, "
         "anon-rss:60356340kB, file-rss:0kB, shmem-rss:0kB, UID:21417 pgtables:169956kB oom_score_adj:0"),
        ("https://github.com/pcyin/tranX/issues/41",
         "[2059991.491542] Out of memory: Killed process 25315 (python3) total-vm:53312244"),
    ],
    "pinned-alloc-failed": [("https://github.com/microsoft/WSL/issues/8447", "RuntimeError: CUDA error: out of memory")],
    "cuda-out-of-memory": [
        ("https://github.com/sgl-project/sglang/issues/4730",
         "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 616.00 MiB. GPU 0 has a total capaci"),
    ],
    "illegal-memory-access": [
        ("https://github.com/sgl-project/sglang/issues/18785",
         "[Bug] CUDA error: an illegal memory access was encountered with SGLang v0.5.8 + HiCache"),
        ("https://github.com/alexandrosstergiou/SoftPool/issues/52",
         "RuntimeError: CUDA error: an illegal memory access was encountered."),
    ],
    "no-kernel-image": [
        ("https://github.com/pytorch/pytorch/issues/149845",
         "RuntimeError: CUDA error: no kernel image is available for execution on the device"),
    ],
    "nccl-shared-memory": [
        ("https://github.com/NVIDIA/nccl/issues/342",
         "include/shm.h:48 NCCL WARN Error while creating shared memory segment "
         "nccl-shm-recv-250a7cc850ba9298-0-1-3 (size 9637888)"),
        ("https://github.com/NVIDIA/nccl-tests/issues/166",
         "ubuntu:9621:9691 [6] misc/shmutils.cc:71 NCCL WARN Error: failed to extend /dev/shm/nccl-fjwOOB to "
         "5967876 bytes"),
    ],
    "peer-access": [
        ("https://github.com/sgl-project/sglang/issues/4814",
         "RuntimeError: CUDART error: peer access is not supported between these two devices"),
        ("https://github.com/sgl-project/sglang/issues/552",
         "Failed: Cuda error /home/runner/work/vllm/vllm/csrc/custom_all_reduce.cuh:307 'peer access is not "
         "supported between these two devices'"),
    ],
    "nccl-unhandled-cuda": [
        ("https://github.com/pytorch/pytorch/issues/111187",
         "torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1331, "
         "unhandled cuda error (run with NCCL_DEBUG=INFO for details)"),
    ],
    "nccl-watchdog-timeout": [
        ("https://github.com/hiyouga/LlamaFactory/issues/7396",
         "[80746] [rank0]:[E321 02:07:08.408271257 ProcessGroupNCCL.cpp:607] [Rank 0] Watchdog caught collective "
         "operation timeout: WorkNCCL(SeqNum=1580, OpType=ALLREDUCE, NumelIn=466119168, NumelOut=466119168, "
         "Timeout(ms)=600000) ran for 600060 milliseconds before timing out."),
    ],
    "cuda-graph-capture": [
        ("https://github.com/sgl-project/sglang/issues/5285",
         "Exception: Capture cuda graph failed: CUDA out of memory. Tried to allocate 448.00 MiB. GPU 7 has a "
         "total capacity of 95.00"),
    ],
    "no-gpu": [
        ("https://github.com/jbilcke-hf/FacePoke/issues/12",
         "RuntimeError: Found no NVIDIA driver on your system. Please check that you have an NVIDIA GPU and "
         "installed a driver from http://www.nvidia.com/Download/index.aspx"),
    ],
    "ptxas-arch-unknown": [
        ("https://github.com/triton-lang/triton/issues/8539",
         "ptxas fatal   : Value 'sm_121a' is not defined for option 'gpu-name'"),
        ("https://github.com/gpustack/gpustack/issues/4372",
         "ptxas fatal : Value 'sm_121a' is not defined for option 'gpu-name'"),
    ],
    "nccl-duplicate-gpu": [
        ("https://github.com/NVIDIA/Megatron-LM/issues/661",
         "Duplicate GPU detected : rank 3 and rank 0 both on CUDA device f000"),
        ("https://github.com/horovod/horovod/issues/3929",
         "[1,2]<stdout>:smc-gpu-03:29880:30398 [0] init.cc:497 NCCL WARN Duplicate GPU detected : rank 2 and "
         "rank 0 both on CUDA device 1000"),
    ],
    "dist-init-unreachable": [
        ("https://github.com/sgl-project/sglang/issues/2561",
         "[E1226 15:44:25.497183572 socket.cpp:1011] [c10d] The client socket has timed out after 600000ms while "
         "trying to connect to (sws-8h100grid-05, 8000)."),
        ("https://github.com/vllm-project/vllm/issues/19670",
         "torch.distributed.DistNetworkError: The client socket has timed out after 600000ms while trying to "
         "connect to (172.17.0.9, 46229)."),
    ],
    "docker-no-gpu-driver": [
        ("https://github.com/NVIDIA/nvidia-docker/issues/1352",
         'docker: Error response from daemon: could not select device driver "" with capabilities: [[gpu]].'),
    ],
    "memlock-rlimit-refused": [
        ("https://github.com/tubearchivist/tubearchivist/issues/393",
         "ERROR: for archivist-es  Cannot start service archivist-es: failed to create shim: OCI runtime create "
         "failed: runc create failed: unable to start container process: error during container init: error "
         "setting rlimits for ready process: error setting rlimit type 8: operation not permitted: unknown"),
    ],
    "wsl-no-gpu-adapter": [
        ("https://github.com/NVIDIA/nvidia-docker/issues/1786",
         "nvidia-container-cli: initialization error: WSL environment detected but no adapters were found: unknown"),
    ],
    "gpu-lost": [
        ("https://github.com/NVIDIA/open-gpu-kernel-modules/issues/1151",
         "NVRM: Xid (PCI:0000:01:00): 79, GPU has fallen off the bus."),
        ("https://github.com/NVIDIA/open-gpu-kernel-modules/issues/1010",
         "april 24 16:22:15 robin-linux-x3d kernel: NVRM: Xid (PCI:0000:01:00): 79, pid=6755, name=vivaldi-bin, GPU "
         "has fallen off the bus."),
    ],
    "wsl2-gpu-resident": [
        ("https://github.com/microsoft/WSL/issues/41176", "misc dxg: dxgk: dxgkio_make_resident: Ioctl failed: -12"),
    ],
    "jit-cache-not-writable": [
        ("https://github.com/flashinfer-ai/flashinfer/issues/2834",
         "`Permission denied: '/usr/local/lib/python3.10/dist-packages/flashinfer_cubin/cubins/flashinfer'`"),
    ],
    "child-failed": [
        ("https://github.com/sgl-project/sglang/issues/5096",
         "ERROR 2025-04-05T00:01:19.209237575Z [2025-04-05 00:01:19] Received sigquit from a child process. It "
         "usually means the child failed."),
    ],
}

#: Rows whose wheel literal is a value of a JSON response body: {row: key}.
JSON_BODY = {"unauthorized": "error"}

#: Rows tested against what the real part prints on this machine (test functions below).
REAL_PART = {"runtime-module-missing", "address-in-use", "zmq-address-in-use", "docker-daemon-gone",
             "python-memory-error",
             # the unified tree's bare asserts, raised by the wheel's own functions in each release
             # (tests/launch/test_diagnose_field_reports.py)
             "radix-cache-assert"}

_REF = re.compile(r"((?:sglang|transformers|torch)/[\w/]+\.py):(\d+)")


# --- the wheels -----------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def transformers_wheel() -> Path:
    """transformers 5.12.1 (SGLang 0.5.19's pin), as .ci/test downloads it into .cache/wheels."""
    d = ROOT / ".cache" / "wheels"
    found = sorted(d.glob("transformers-5.12.1-*.whl"))
    if not found:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", TRANSFORMERS, "-d", str(d)],
                       check=True, timeout=300)
        found = sorted(d.glob("transformers-5.12.1-*.whl"))
    assert found, f"no {TRANSFORMERS} wheel in {d}"
    return found[0]


@pytest.fixture(scope="session")
def source_of(transformers_wheel):
    """``(path) -> list of lines`` for a file of the pinned wheels."""
    sg = os.environ.get("ESCHA_SGLANG_WHEEL")
    assert sg and Path(sg).is_file(), "ESCHA_SGLANG_WHEEL must name the sglang 0.5.19 wheel (.ci/test sets it)"
    assert "sglang-0.5.19-" in Path(sg).name
    zips = {"sglang": zipfile.ZipFile(sg), "transformers": zipfile.ZipFile(transformers_wheel)}
    import torch

    assert torch.__version__.startswith("2.13."), torch.__version__
    torch_dir = Path(torch.__file__).parent

    def read(path: str) -> list[str]:
        top = path.split("/", 1)[0]
        if top == "torch":
            return (torch_dir / path.split("/", 1)[1]).read_text().splitlines()
        return zips[top].read(path).decode().splitlines()

    return read


_LITERAL = re.compile(r"""[rRfFbBuU]*("(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')""")


def render(lines: list[str], lineno: int) -> str:
    """The message at ``lineno`` (1-based), rendered: the string literals of that statement
    concatenated (a line inside a triple-quoted string is taken as is), escapes decoded,
    ``{x:.2f}`` -> 12.34, ``{x=}`` -> x=120, other fields -> 120."""
    first = lines[lineno - 1]
    if '"' not in first and "'" not in first:  # inside a triple-quoted template
        text = first
    else:
        parts = []
        for ln in lines[lineno - 1:lineno + 8]:
            lits = _LITERAL.findall(ln)
            if not lits:
                break
            parts += [lit[1:-1] for lit in lits]
            if ln.rstrip().endswith(")") and not ln.rstrip().endswith('")') and not ln.rstrip().endswith("')"):
                break
        text = codecs.decode("".join(parts), "unicode_escape")
    text = re.sub(r"\{[^{}]*:\.\d+f\}", "12.34", text)
    text = re.sub(r"\{([^{}]+)=\}", lambda m: f"{m.group(1)}=120", text)
    return re.sub(r"\{[^{}]*\}", "120", text)


def _rows_with(pattern_only=True):
    return [s for s in SIGNATURES if s.pattern is not None or not pattern_only]


# --- the table as a whole -------------------------------------------------------------------------


def test_table_has_at_least_20_signatures_covering_every_kind():
    ids = {s.id for s in SIGNATURES}
    assert len(ids) >= 20
    assert {s.kind for s in SIGNATURES} == set(KINDS)
    for s in SIGNATURES:
        assert s.cause and s.fix and s.source, s.id
        assert "DESIGN" + ".md" not in s.cause + s.fix + s.source and "seed" not in s.cause + s.fix


def test_every_pattern_row_is_tested_against_a_real_message():
    untested = [s.id for s in _rows_with() if not _REF.search(s.source) and s.id not in QUOTES
                and s.id not in REAL_PART]
    assert untested == []
    for rid, quotes in QUOTES.items():  # each quoted row names its report in the table
        src = next(s.source for s in SIGNATURES if s.id == rid)
        assert any(url in src for url, _ in quotes) or "quoted in" not in src, (rid, src)


@pytest.mark.wheel
@pytest.mark.parametrize("sig", [s for s in _rows_with() if _REF.search(s.source)], ids=lambda s: s.id)
def test_pattern_matches_the_format_string_in_the_pinned_wheel(sig, source_of):
    for path, line in _REF.findall(sig.source):
        lines = source_of(path)
        rendered = render(lines, int(line))
        if sig.id in JSON_BODY:  # the literal is a value in a JSON response body (ORJSONResponse: compact)
            rendered = json.dumps({JSON_BODY[sig.id]: rendered}, separators=(",", ":"))
        rx = re.compile(sig.pattern)
        assert any(rx.search(x) for x in rendered.splitlines()), f"{path}:{line} renders {rendered!r}"
        # the whole pipeline: a log line with SGLang's prefix is diagnosed as this row
        facts = Facts(exit_code=1, hicache_enabled=True, platform="linux")
        got = diagnose(["[2026-11-30 09:00:00 TP0] " + x for x in rendered.splitlines()], facts)
        assert sig.id in [m.id for m in got.matches], (path, line, rendered)


@pytest.mark.wheel
@pytest.mark.parametrize("sig", [s for s in SIGNATURES if "says '" in s.sglang_advice and _REF.search(s.source)],
                         ids=lambda s: s.id)
def test_sglang_advice_we_correct_is_what_sglang_prints(sig, source_of):
    """Where the table says SGLang's printed advice is wrong, that advice is really in the wheel."""
    quoted = re.findall(r"says '([^']+)'", sig.sglang_advice)
    assert quoted
    path, line = _REF.findall(sig.source)[0]
    text = "".join(source_of(path)[int(line) - 1:int(line) + 6])
    flat = re.sub(r'"\s*f?"', "", text)  # join implicitly concatenated literals
    assert all(q in flat for q in quoted), (quoted, flat)


@pytest.mark.wheel
def test_cuda_graph_advice_is_sglangs(source_of):
    text = "\n".join(source_of("sglang/srt/model_executor/runner_backend_utils/__init__.py")[13:22])
    assert "disable decode CUDA graph" in text
    sig = next(s for s in SIGNATURES if s.id == "cuda-graph-capture")
    assert "disabling decode CUDA graphs" in sig.sglang_advice


@pytest.mark.parametrize("rid,url,line", [(r, u, ln) for r, qs in QUOTES.items() for u, ln in qs])
def test_pattern_matches_a_line_quoted_from_a_public_report(rid, url, line):
    sig = next(s for s in SIGNATURES if s.id == rid)
    assert re.search(sig.pattern, line), (url, line)
    facts = Facts(hicache_enabled=True, platform="wsl2")
    assert rid in [m.id for m in diagnose([line], facts).matches]


# --- rows tested against the real part here ---------------------------------------------------------


def test_module_missing_against_cpython():
    r = subprocess.run([sys.executable, "-c", "import escha_no_such_module_x"], capture_output=True, text=True)
    d = diagnose(r.stderr.splitlines(), Facts(exit_code=r.returncode))
    assert [m.id for m in d.matches] == ["runtime-module-missing"]
    assert "escha_no_such_module_x" in d.matches[0].explanation


def test_memory_error_against_cpython_under_an_address_space_limit():
    """A real interpreter whose address space is capped (RLIMIT_AS, as `ulimit -v` sets) runs
    out of memory: its real traceback, with and without SGLang's log prefix, is host memory."""
    import resource

    def cap():
        resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))

    r = subprocess.run([sys.executable, "-c", "x = bytearray(8 * 2**30)"], capture_output=True, text=True,
                       preexec_fn=cap, timeout=60)
    assert r.returncode == 1 and r.stderr.splitlines()[-1] == "MemoryError"
    d = diagnose(r.stderr.splitlines(), Facts(exit_code=r.returncode))
    assert [m.id for m in d.matches] == ["python-memory-error"] and d.conclusive
    assert d.matches[0].kind == "host-memory"
    prefixed = ["[2026-11-29 16:20:01 TP0] " + ln for ln in r.stderr.splitlines()]
    assert [m.id for m in diagnose(prefixed).matches] == ["python-memory-error"]
    assert diagnose(["numpy: MemoryErrors are rare"]).matches == []


def test_address_in_use_against_a_real_bind():
    with socket.socket() as a, socket.socket() as b:
        a.bind(("127.0.0.1", 0))
        a.listen()
        with pytest.raises(OSError) as exc:
            b.bind(a.getsockname())
    line = f"ERROR:    [Errno {exc.value.errno}] {exc.value.strerror}"  # uvicorn logs the OSError like this
    assert [m.id for m in diagnose([line]).matches] == ["address-in-use"]


def test_zmq_address_in_use_against_real_pyzmq():
    """Two real pyzmq sockets on one port, as SGLang's get_zmq_socket binds its internal
    endpoints (pyzmq is SGLang 0.5.19's own dependency): the traceback's last line."""
    zmq = pytest.importorskip("zmq")
    import traceback

    ctx = zmq.Context()
    a, b = ctx.socket(zmq.PULL), ctx.socket(zmq.PULL)
    try:
        port = a.bind_to_random_port("tcp://127.0.0.1")
        with pytest.raises(zmq.error.ZMQError) as exc:
            b.bind(f"tcp://127.0.0.1:{port}")
    finally:
        a.close(0)
        b.close(0)
        ctx.term()
    lines = "".join(traceback.format_exception(exc.value)).splitlines()
    assert lines[-1].startswith("zmq.error.ZMQError: Address already in use")
    d = diagnose(["Traceback (most recent call last):", *lines[1:]], Facts(exit_code=1))
    assert [m.id for m in d.matches] == ["zmq-address-in-use"]
    assert f"(tcp://127.0.0.1:{port})" in d.matches[0].explanation


def test_docker_daemon_gone_against_real_docker_py(tmp_path):
    """docker-py pointed at a socket with no daemon behind it: the error it really raises."""
    import docker

    with pytest.raises(docker.errors.DockerException) as exc:
        docker.DockerClient(base_url=f"unix://{tmp_path}/gone.sock")
    d = diagnose(str(exc.value).splitlines())
    assert [m.id for m in d.matches] == ["docker-daemon-gone"] and d.conclusive


# --- B40: a process killed by SIGKILL ----------------------------------------------------------------


def _killed_child() -> tuple[list[str], int]:
    """A real child that prints a normal start and a prefill line, then dies by SIGKILL."""
    code = ("import os, signal, sys\n"
            "print('[2026-11-30 09:00:00] The server is fired up and ready to roll!', flush=True)\n"
            "print('[2026-11-30 09:00:01 TP0] Prefill batch, #new-seq: 1, #new-token: 8192', flush=True)\n"
            "os.kill(os.getpid(), signal.SIGKILL)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    return r.stdout.splitlines(), r.returncode


def test_b40_sigkill_without_oom_evidence_is_unproven():
    """Before: 'no known signature'. After: SIGKILL named from the exit status, out of memory
    likely but unproven (exit 5 from `diagnose`)."""
    lines, code = _killed_child()
    assert code == -signal.SIGKILL
    d = diagnose(lines, Facts(exit_code=code, pinned_total_bytes=10_241_212_416))
    assert [m.id for m in d.matches] == ["killed-sigkill"] and not d.conclusive
    m = d.matches[0]
    assert "killed by signal 9" in m.explanation and "out of memory likely but unproven" in m.explanation
    assert any("10.24 GB" in e for e in m.evidence)  # the plan's pinned total
    assert "OOM killer killed" not in m.explanation


def test_b40_sigkill_with_the_oom_count_risen_is_the_oom_killer():
    lines, code = _killed_child()
    d = diagnose(lines, Facts(exit_code=137, oom_kill=True, platform="wsl2"))
    assert [m.id for m in d.matches] == ["oom-killer"] and d.conclusive
    assert "OOM killer" in d.matches[0].explanation and ".wslconfig" in d.matches[0].fix
    no_rise = diagnose(lines, Facts(exit_code=137, oom_kill=False))
    assert not no_rise.conclusive and "did not rise" in no_rise.matches[0].explanation


def test_diagnose_command_exit_codes(cli, tmp_path):
    lines, code = _killed_child()
    log = tmp_path / "server.log"
    log.write_text("\n".join(lines + ["Killed"]) + "\n")
    r = cli("diagnose", str(log))
    assert r.code == 5 and "killed-line" in r.out and "unproven" in r.out
    r = cli("diagnose", str(log), "--exit-code", "137", "--oom-killed")
    assert r.code == 0 and "oom-killer" in r.out and "fix:" in r.out and "evidence:" in r.out
    quoted = tmp_path / "graph.log"
    quoted.write_text(QUOTES["cuda-graph-capture"][0][1] + "\n")
    r = cli("diagnose", str(quoted), "-f", "json")
    assert r.code == 0 and '"cuda-graph-capture"' in r.out
    empty = tmp_path / "empty.log"
    empty.write_text("all fine\n")
    assert cli("diagnose", str(empty)).code == 5
    assert cli("diagnose", str(tmp_path / "missing.log")).code == 2


def test_unauthorized_against_a_real_http_client_error():
    """httpx's own text for a 401 (the client escha-deploy's probes use)."""
    import httpx

    resp = httpx.Response(401, request=httpx.Request("GET", "http://127.0.0.1:30000/v1/models"),
                          json={"error": "Unauthorized"})
    with pytest.raises(httpx.HTTPStatusError) as exc:
        resp.raise_for_status()
    assert [m.id for m in diagnose(str(exc.value).splitlines()).matches] == ["unauthorized"]
    assert [m.id for m in diagnose([resp.text]).matches] == ["unauthorized"]


def test_our_event_rows_from_facts():
    assert [m.id for m in diagnose([], Facts(daemon_gone=True)).matches] == ["docker-daemon-gone"]
    assert [m.id for m in diagnose([], Facts(http_status=401)).matches] == ["unauthorized"]
    stopped = diagnose([], Facts(exit_code=143))
    assert [m.id for m in stopped.matches] == ["killed-by-signal"] and "SIGTERM" in "\n".join(stopped.lines())


def test_field_report_logs_name_the_cause_and_fix():
    """The log halves of three field reports: peer access (custom all-reduce on two consumer
    cards) names --disable-custom-all-reduce; the kernel-image error names the architecture;
    the loader's missing config.json names the folder and the one-level-off fix."""
    p2p = diagnose([QUOTES["peer-access"][0][1]])
    assert [m.id for m in p2p.matches] == ["peer-access"] and "--disable-custom-all-reduce" in p2p.matches[0].fix
    arch = diagnose([QUOTES["no-kernel-image"][0][1]])
    assert arch.matches[0].kind == "arch" and "compute capability" in arch.matches[0].fix
    assert "CUDA_LAUNCH_BLOCKING" in arch.matches[0].sglang_advice
    folder = diagnose(["OSError: /models/Qwen3.x-27B does not appear to have a file named config.json. Checkout "
                       "'https://huggingface.co//models/Qwen3.x-27B/tree/None' for available files."])
    m = folder.matches[0]
    assert m.id == "model-file-missing" and "/models/Qwen3.x-27B" in m.explanation and "config.json" in m.explanation
    assert "one level down" in m.fix


# --- field reports, round three: the rows against the real parts and the real formats ---------


def test_dist_init_timeout_against_real_torch_tcpstore():
    """A rank whose rendezvous port has nobody behind it: torch 2.13's own TCPStore client
    (what SGLang's ``--dist-init-addr`` reaches) on a loopback port that was just freed, with a
    1 s timeout. The row names the address, the port and what to do."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code = ("import datetime, torch.distributed as d\n"
            f"d.TCPStore('127.0.0.1', {port}, is_master=False, timeout=datetime.timedelta(seconds=1))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode != 0
    d = diagnose(r.stderr.splitlines(), Facts(exit_code=r.returncode))
    m = next(m for m in d.matches if m.id == "dist-init-unreachable")
    assert f"127.0.0.1:{port}" in m.explanation and f"open port {port}" in m.fix, r.stderr[-2000:]
    assert "start rank 0 first" in m.fix and "boxes.N.address" in m.fix


def test_ptxas_in_graph_capture_is_the_toolchain_not_memory():
    """SGLang's capture error (decode_cuda_graph_runner.py: 'Capture cuda graph failed: ...')
    around Triton's ptxas line (triton-lang/triton#8539): the compiler row, not the memory row."""
    lines = ["Exception: Capture cuda graph failed: PTXAS error: Internal Triton PTX codegen error",
             "`ptxas` stderr:", QUOTES["ptxas-arch-unknown"][0][1]]
    d = diagnose(lines, Facts(exit_code=1))
    assert [m.id for m in d.matches] == ["ptxas-arch-unknown"]
    m = d.matches[0]
    assert "sm_121a" in m.explanation and "does not help" in m.explanation and "TRITON_PTXAS_PATH" in m.fix
    assert "sglang-kernel" in m.fix and "sm_120" in m.fix  # the image's architecture list


@pytest.mark.docker
def test_no_gpu_driver_against_this_daemon(docker_client, base_image):
    """This daemon has no NVIDIA runtime: a container asking for GPUs (as ``up`` asks) fails at
    start with Docker's own message, which the row names."""
    import docker
    import uuid

    info = docker_client.info()
    if "nvidia" in (info.get("Runtimes") or {}) or info.get("CDISpecDirs"):
        pytest.skip("this daemon has a GPU runtime: it would start the container")
    name = f"escha-test-nogpu-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    c = docker_client.containers.create(base_image, command=["true"], name=name, labels={"io.escha.test": name},
                                        device_requests=[docker.types.DeviceRequest(count=-1, capabilities=[["gpu"]])])
    try:
        with pytest.raises(docker.errors.APIError) as info_:
            c.start()
    finally:
        c.remove(force=True)
    d = diagnose([str(info_.value)])
    assert [m.id for m in d.matches] == ["docker-no-gpu-driver"], str(info_.value)
    assert "nvidia-ctk runtime configure" in d.matches[0].fix


def _scheduler_crash(rank: int, stamp: str) -> list[str]:
    """What SGLang's scheduler prints when it dies: ``logger.error(f"Scheduler hit an exception:
    {traceback}")`` (sglang/srt/managers/scheduler.py) with configure_logger's prefix
    ``[%(asctime)s TP0]``, the traceback from a real exception."""
    import traceback

    try:
        raise RuntimeError("CUDA driver initialization failed, you might not have a CUDA gpu.")
    except RuntimeError:
        tb = traceback.format_exc()
    return f"[{stamp} TP{rank}] Scheduler hit an exception: {tb}".rstrip("\n").splitlines()


def _starts(n: int, ranks: int = 2) -> list[str]:
    out = []
    for i in range(n):
        stamp = f"2026-12-01 09:00:0{i}"
        out.append(f"[{stamp}] server_args={{'tp_size': {ranks}, 'enable_hierarchical_cache': False}}")
        for r in range(ranks):
            out += _scheduler_crash(r, stamp)
    return out


@pytest.mark.wheel
def test_crash_loop_counts_starts_not_ranks_and_shows_the_first_traceback():
    sg = os.environ.get("ESCHA_SGLANG_WHEEL")
    assert sg and Path(sg).is_file()
    with zipfile.ZipFile(sg) as z:
        assert 'logger.error(f"Scheduler hit an exception: {traceback}")' in z.read(
            "sglang/srt/managers/scheduler.py").decode()
    two = diagnose(_starts(2))  # TP2, one restart: 4 tracebacks, 2 starts
    assert "repeating-traceback" not in [m.id for m in two.matches]
    three = diagnose(_starts(3))
    m = next(m for m in three.matches if m.id == "repeating-traceback")
    assert "ended the server 3 starts" in m.explanation and "2 restarts" in m.explanation
    assert "TP0, TP1" in m.explanation
    assert m.evidence[0] == "Scheduler hit an exception: Traceback (most recent call last):"
    assert m.evidence[-1].startswith("RuntimeError: CUDA driver initialization failed") and len(m.evidence) <= 12
