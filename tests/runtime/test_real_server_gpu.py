"""The real server through the product, on a CUDA GPU (marked ``gpu``).

Native ``escha-deploy serve --profile tests/gpu_rig/h200-tiny.yaml``: SGLang 0.5.19 patched by
escha-deploy's series, from the serving closure (``scripts/gpu_closure.py install``, which
``scripts/gpu-run.sh`` runs and whose runtime description ``$ESCHA_RUNTIME_DESCRIPTION``
names), serving a tiny random-weight hybrid Qwen3.5 model made on the machine
(``tests/gpu_rig/make_model.py tiny``). One server for the module; in order:

1. ``plan`` of the rig plans the closure's runtime (its release and capabilities, from its
   description: no ``runtime.needs`` override), and ``serve``'s log shows SGLang's pre-flight
   passed on the real GPU with the plan's per-rank host pool bytes;
2. a prefix pushed out of the 2,048-token device pool by other prompts comes back from the host
   tier: the response's ``meta_info.cached_tokens_details.host`` > 0 and
   ``sglang:load_back_tokens_total{pool="kv"}`` (summed over its ``cache_type`` label:
   ``srt/observability/metrics_collector.py``, counted per completed load in
   ``srt/mem_cache/unified_radix_cache.py: loading_check``) rises by at least that host hit less
   one page;
3. SIGTERM to ``serve``: it exits, and no process of the server's tree (``serve``, SGLang's
   launcher, scheduler, detokenizer, the watchdog) is left.

Nothing here stands in for SGLang; the closure's departures from a stock install are its own
(docs/runtime.md, "The serving closure"). ``$ESCHA_GPU_LOGS``: where serve's log is kept (else a
temp dir); ``$ESCHA_GPU_REPORT``: a JSON file the figures are added to.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

REPO = Path(__file__).resolve().parents[2]
PROFILE = REPO / "tests" / "gpu_rig" / "h200-tiny.yaml"
MAKE_MODEL = REPO / "tests" / "gpu_rig" / "make_model.py"
#: Time to ready: 34 s with the JIT caches of an earlier run, about 80 s without (H200,
#: 2026-12-01); the first forward then compiles Triton's GDN kernels (about 47 s).
READY_TIMEOUT_S = 300
REQUEST_TIMEOUT_S = 240
PREFIX_TOKENS = 1000
PAGE = 1  # the rig's page_size


def _report(key: str, value) -> None:
    path = os.environ.get("ESCHA_GPU_REPORT")
    if not path:
        return
    p = Path(path)
    doc = json.loads(p.read_text()) if p.is_file() else {}
    doc[key] = value
    p.write_text(json.dumps(doc, indent=1, default=str))


def _closure_description() -> dict:
    """The closure's runtime description, or skip: no CUDA device, or no closure installed."""
    try:
        import torch
    except ImportError:
        pytest.skip("no torch: not a GPU machine")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    path = os.environ.get("ESCHA_RUNTIME_DESCRIPTION")
    if not path or not Path(path).is_file():
        pytest.skip("no serving closure installed: run `bash scripts/gpu-run.sh` (it installs .closure/ and "
                    "sets ESCHA_RUNTIME_DESCRIPTION)")
    desc = json.loads(Path(path).read_text())
    if desc.get("kind") != "closure":
        pytest.skip(f"{path} describes no serving closure (kind {desc.get('kind')!r})")
    return desc


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _model_path() -> Path:
    import yaml

    return Path(yaml.safe_load(PROFILE.read_text())["model"]["path"])


@dataclass
class Server:
    proc: subprocess.Popen
    port: int
    log: Path
    seconds_to_ready: float
    tree: list = field(default_factory=list)  # psutil.Process of serve and its descendants at ready

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")


def _tree(pid: int) -> list:
    import psutil

    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def _alive(procs: list) -> list:
    """Those of ``procs`` still running (same pid and start time; zombies count as gone)."""
    import psutil

    left = []
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                left.append(p)
        except psutil.NoSuchProcess:
            pass
    return left


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    import httpx

    _closure_description()
    model = _model_path()
    if not (model / "config.json").is_file():
        r = subprocess.run([sys.executable, str(MAKE_MODEL), "tiny", str(model)], capture_output=True, text=True,
                           timeout=300)
        assert r.returncode == 0, r.stderr[-3000:]
    logs = Path(os.environ.get("ESCHA_GPU_LOGS") or tmp_path_factory.mktemp("logs"))
    logs.mkdir(parents=True, exist_ok=True)
    log = logs / "serve-tiny.log"
    port = _free_port()
    t0 = time.monotonic()
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "escha_deploy", "serve", "--profile", str(PROFILE),
                                 "--set", f"container.port={port}"], stdout=out, stderr=subprocess.STDOUT,
                                cwd=REPO, env=dict(os.environ))
    srv = Server(proc=proc, port=port, log=log, seconds_to_ready=0.0)
    try:
        while True:
            if proc.poll() is not None:
                pytest.fail(f"serve exited {proc.returncode} before ready:\n{srv.log_text()[-6000:]}")
            if time.monotonic() - t0 > READY_TIMEOUT_S:
                pytest.fail(f"not ready in {READY_TIMEOUT_S} s:\n{srv.log_text()[-6000:]}")
            try:
                if httpx.get(srv.base + "/health", timeout=3).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(1)
        srv.seconds_to_ready = round(time.monotonic() - t0, 1)
        srv.tree = _tree(proc.pid)
        _report("real_server/ready", {"seconds": srv.seconds_to_ready, "processes": len(srv.tree)})
        yield srv
    finally:
        for p in _alive(_tree(proc.pid) + srv.tree):  # what a failed test left: nothing may outlive the module
            try:
                p.kill()
            except Exception:
                pass
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass


def test_serve_plans_the_closure_and_its_preflight_passes(server):
    desc = _closure_description()
    r = subprocess.run([sys.executable, "-m", "escha_deploy", "plan", "--profile", str(PROFILE), "--format", "json"],
                       capture_output=True, text=True, cwd=REPO, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    plan = json.loads(r.stdout)
    # the closure's description decides the runtime planned: its release and its capabilities
    assert plan["sglang_release"] == desc["sglang_version"] == "0.5.19"
    assert plan["sglang_release_source"].startswith("this runtime"), plan["sglang_release_source"]
    assert sorted(plan["capabilities"]) == sorted(desc["capabilities"]) != []
    text = server.log_text()
    m = re.search(r"SGLang's pre-flight passed in .*?host pools (\d+) B KV \+ (\d+) B mamba per rank", text)
    assert m, text[-4000:]
    figures = {"preflight_host_kv_bytes": int(m.group(1)), "preflight_host_mamba_bytes": int(m.group(2)),
               "plan_host_kv_bytes": plan["per_rank"]["host_kv_bytes"],
               "plan_host_mamba_bytes": plan["per_rank"]["host_mamba_bytes"]}
    _report("real_server/preflight", figures)
    assert (figures["preflight_host_kv_bytes"], figures["preflight_host_mamba_bytes"]) == (
        figures["plan_host_kv_bytes"], figures["plan_host_mamba_bytes"])


def _load_back_kv(base: str) -> float:
    """``sglang:load_back_tokens_total{pool="kv"}`` summed over its other labels (0 before the
    first load-back: the series appears then)."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    total = 0.0
    for fam in text_string_to_metric_families(httpx.get(base + "/metrics", timeout=30).text):
        for s in fam.samples:
            if s.name == "sglang:load_back_tokens_total" and s.labels.get("pool") == "kv":
                total += s.value
    return total


def _generate(base: str, ids: list[int]) -> dict:
    import httpx

    t = time.monotonic()
    r = httpx.post(base + "/generate", json={"input_ids": ids, "sampling_params": {
        "max_new_tokens": 4, "temperature": 0, "ignore_eos": True}}, timeout=REQUEST_TIMEOUT_S)
    assert r.status_code == 200, r.text[:2000]
    mi = r.json().get("meta_info", {})
    return {"prompt_tokens": mi.get("prompt_tokens"), "cached_tokens": mi.get("cached_tokens"),
            "details": mi.get("cached_tokens_details"), "seconds": round(time.monotonic() - t, 3)}


def _ids(seed: int, n: int) -> list[int]:
    """``n`` token ids below the tokenizer's vocabulary (2000), distinct per ``seed``."""
    return [(17 * seed + 31 * k + 7 * (k // 97)) % 1990 + 5 for k in range(n)]


def test_a_prefix_pushed_out_of_the_device_pool_comes_back_from_host(server):
    prefix = _ids(0, PREFIX_TOKENS)
    before = _load_back_kv(server.base)
    steps = [("prefix + a", _generate(server.base, prefix + _ids(100, 24)))]
    # three other 1,000-token prompts: 3,000+ tokens through a 2,048-token device pool
    for i in (1, 2, 3):
        steps.append((f"other {i}", _generate(server.base, _ids(i, PREFIX_TOKENS))))
    again = _generate(server.base, prefix + _ids(200, 24))
    steps.append(("prefix + c", again))
    host = (again["details"] or {}).get("host", 0)
    # the counter moves when the load's ack is polled (loading_check): read it until it settles
    deadline, after = time.monotonic() + 15, before
    while time.monotonic() < deadline:
        after = _load_back_kv(server.base)
        if after - before >= host - PAGE > 0:
            break
        time.sleep(0.5)
    _report("real_server/load_back", {"steps": steps, "host_hit": host, "load_back_kv_before": before,
                                      "load_back_kv_after": after})
    assert host > 0, steps
    assert after - before >= host - PAGE, (before, after, steps)


def test_sigterm_leaves_no_process_of_the_server_tree(server):
    import psutil

    tree = _alive(_tree(server.proc.pid) + server.tree)
    assert len(tree) >= 3, [p.pid for p in tree]  # serve, SGLang's launcher and its workers
    t0 = time.monotonic()
    server.proc.send_signal(signal.SIGTERM)
    code = server.proc.wait(timeout=90)
    gone_s = round(time.monotonic() - t0, 1)
    psutil.wait_procs(tree, timeout=15)
    left = _alive(tree)
    _report("real_server/sigterm", {"exit": code, "seconds": gone_s, "tree": len(tree),
                                    "left": [(p.pid, p.name()) for p in left]})
    assert code == 0, server.log_text()[-3000:]
    assert left == [], [(p.pid, p.cmdline()) for p in left]
