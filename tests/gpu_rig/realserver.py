"""What the real-server gpu tests share (tests/runtime/test_real_server*_gpu.py): the closure's
runtime description, ``plan`` and ``serve --print`` of a rig profile, starting the server
(native ``escha-deploy serve --profile``, or SGLang's own launcher on a given argv for the stock
tree), readiness, the process tree, a MemAvailable sampler, SIGTERM, and the figures written to
``$ESCHA_GPU_REPORT`` (a JSON object; ``scripts/gpu_report_to_docs.py`` renders it into
docs/runtime.md). Nothing here stands in for SGLang.

Units: bytes (``int``); seconds (``float``, monotonic clock).
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
RIG = REPO / "tests" / "gpu_rig"
MAKE_MODEL = RIG / "make_model.py"
MiB = 2**20
GiB = 2**30


def report(key: str, value) -> None:
    """Add ``key: value`` to the JSON object at ``$ESCHA_GPU_REPORT`` (nothing when unset)."""
    path = os.environ.get("ESCHA_GPU_REPORT")
    if not path:
        return
    p = Path(path)
    doc = json.loads(p.read_text()) if p.is_file() else {}
    doc[key] = value
    p.write_text(json.dumps(doc, indent=1, default=str))


def closure_description() -> dict:
    """The installed closure's runtime description, or skip: no CUDA device, or no closure."""
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


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def escha(*args: str, timeout: float = 300, env: dict | None = None) -> subprocess.CompletedProcess:
    """``python -m escha_deploy ARGS`` from the checkout, in ``env`` (default this environment)."""
    return subprocess.run([sys.executable, "-m", "escha_deploy", *args], capture_output=True, text=True,
                          cwd=REPO, timeout=timeout, env=env)


def plan_json(profile: Path, sets: list[str] = (), extra: list[str] = (), env: dict | None = None) -> dict:
    """``escha-deploy plan --profile P --set S... --format json``, parsed; fails the test on a
    non-zero exit."""
    args = ["plan", "--profile", str(profile), *extra]
    for s in sets:
        args += ["--set", s]
    r = escha(*args, "--format", "json", env=env)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    return json.loads(r.stdout)


def make_model(profile: Path, config: str) -> Path:
    """The rig model ``profile`` serves (``model.path``), made by make_model.py CONFIG when absent."""
    import yaml

    model = Path(yaml.safe_load(profile.read_text())["model"]["path"])
    if not (model / "config.json").is_file():
        r = subprocess.run([sys.executable, str(MAKE_MODEL), config, str(model)], capture_output=True, text=True,
                           timeout=300)
        assert r.returncode == 0, r.stderr[-3000:]
    return model


def logs_dir(tmp_path_factory) -> Path:
    logs = Path(os.environ.get("ESCHA_GPU_LOGS") or tmp_path_factory.mktemp("logs"))
    logs.mkdir(parents=True, exist_ok=True)
    return logs


def meminfo() -> dict[str, int]:
    """/proc/meminfo's ``MemTotal`` and ``MemAvailable``, bytes."""
    out: dict[str, int] = {}
    with open("/proc/meminfo") as f:
        for line in f:
            key = line.split(":", 1)[0]
            if key in ("MemTotal", "MemAvailable"):
                out[key] = int(line.split()[1]) * 1024
    if len(out) != 2:
        raise RuntimeError("/proc/meminfo lacks MemTotal or MemAvailable")
    return out


def meminfo_all() -> dict[str, int]:
    """Every /proc/meminfo field; sizes in bytes (the ``kB`` ones times 1024), counts as they are."""
    out: dict[str, int] = {}
    with open("/proc/meminfo") as f:
        for line in f:
            key, _, rest = line.partition(":")
            parts = rest.split()
            if parts:
                out[key] = int(parts[0]) * (1024 if parts[1:] == ["kB"] else 1)
    return out


def smaps_rollup(pid: int) -> dict[str, int]:
    """/proc/PID/smaps_rollup's fields in bytes (``Rss``, ``Pss``, ``Anonymous``, ``Locked``, ...);
    empty when the process is gone or unreadable."""
    out: dict[str, int] = {}
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                key, _, rest = line.partition(":")
                parts = rest.split()
                if len(parts) == 2 and parts[1] == "kB":
                    out[key] = int(parts[0]) * 1024
    except OSError:
        pass
    return out


def smaps_by_mapping(pid: int) -> dict[str, int]:
    """Resident bytes per mapping name of /proc/PID/smaps (``[anon]`` for unnamed mappings, the
    path or ``[heap]``/``[stack]`` otherwise), summed over the mappings of one name."""
    out: dict[str, int] = {}
    name = "[anon]"
    try:
        with open(f"/proc/{pid}/smaps") as f:
            for line in f:
                head = line.split(None, 5)
                if head and "-" in head[0] and len(head) >= 5 and not head[0].endswith(":"):
                    name = head[5].strip() if len(head) > 5 and head[5].strip() else "[anon]"
                elif line.startswith("Rss:"):
                    out[name] = out.get(name, 0) + int(line.split()[1]) * 1024
    except OSError:
        pass
    return out


def mem_available() -> int:
    """``MemAvailable`` of /proc/meminfo, bytes."""
    return meminfo()["MemAvailable"]


def mem_used() -> int:
    """``MemTotal - MemAvailable``, bytes: what the machine's processes hold. A GPU machine whose
    memory is hot-plugged as it is used (a VM that starts small) raises MemTotal while a big
    allocation runs, so a drop in MemAvailable alone under-reads it; the used figure does not."""
    m = meminfo()
    return m["MemTotal"] - m["MemAvailable"]


class MemSampler:
    """``MemAvailable`` every ``interval`` seconds in a thread, and the server log's lines as
    they appear (each with the time it was first seen), so a figure can be read "at" a log line:
    ``at(pattern)`` is the last sample taken before the line matching ``pattern`` was seen,
    ``after(pattern)`` the first sample taken once the line after it was seen."""

    def __init__(self, log: Path, interval: float = 0.05) -> None:
        self.log, self.interval = log, interval
        self.samples: list[tuple[float, int]] = []
        #: ``(time, MemTotal - MemAvailable)``, taken with each sample (see ``mem_used``)
        self.used: list[tuple[float, int]] = []
        self.lines: list[tuple[float, str]] = []
        self._stop = threading.Event()
        self._pos = 0
        self._partial = ""
        self._thread = threading.Thread(target=self._run, daemon=True)
        #: every meminfo field with each sample (``meminfo_all``), for where a window's bytes went
        self.full: list[tuple[float, dict[str, int]]] = []
        #: ``(time, {pid: (name, smaps_rollup)})`` of the watched tree, every ``rollup_every`` samples
        self.rollups: list[tuple[float, dict[int, tuple[str, dict[str, int]]]]] = []
        self.rollup_every = 5
        #: ``key: (time, {pid: (name, smaps_by_mapping)})`` taken when a line matching
        #: ``snap_on[key]`` is first seen (SGLang logs the pools' lines before allocating them)
        self.snap_on: dict[str, str] = {}
        self.snaps: dict[str, tuple[float, dict[int, tuple[str, dict[str, int]]]]] = {}
        self.root_pid: int | None = None
        self._n = 0

    def watch(self, pid: int) -> MemSampler:
        """Take per-process readings of ``pid`` and its descendants from now on."""
        self.root_pid = pid
        return self

    def tree_readings(self, read) -> dict[int, tuple[str, dict[str, int]]]:
        """``read(pid)`` for the watched process and each descendant, with its name."""
        if self.root_pid is None:
            return {}
        out = {}
        for p in tree(self.root_pid):
            try:
                out[p.pid] = (p.name(), read(p.pid))
            except Exception:
                continue
        return out

    def _sample(self) -> None:
        t, m = time.monotonic(), meminfo_all()
        self.samples.append((t, m["MemAvailable"]))
        self.used.append((t, m["MemTotal"] - m["MemAvailable"]))
        self.full.append((t, m))
        self._n += 1
        if self.root_pid is not None and self._n % self.rollup_every == 0:
            self.rollups.append((t, self.tree_readings(smaps_rollup)))

    def start(self) -> MemSampler:
        self._sample()
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _read_log(self, now: float) -> None:
        try:
            with open(self.log, "rb") as f:
                f.seek(self._pos)
                chunk = f.read()
        except FileNotFoundError:
            return
        self._pos += len(chunk)
        text = self._partial + chunk.decode(errors="replace")
        *done, self._partial = text.split("\n")
        self.lines += [(now, ln) for ln in done]
        for key, pattern in self.snap_on.items():
            if key not in self.snaps and any(re.search(pattern, ln) for ln in done):
                self.snaps[key] = (time.monotonic(), self.tree_readings(smaps_by_mapping))

    def _run(self) -> None:
        while not self._stop.is_set():
            now = time.monotonic()
            self._read_log(now)  # the log first: a line seen now was written before this sample
            self._sample()
            self._stop.wait(self.interval)

    def line_index(self, pattern: str, start: int = 0) -> int | None:
        rx = re.compile(pattern)
        return next((i for i in range(start, len(self.lines)) if rx.search(self.lines[i][1])), None)

    def before_time(self, t: float) -> int:
        """The last sample taken before ``t``."""
        return [v for ts, v in self.samples if ts < t][-1]

    def after_time(self, t: float) -> int:
        """The first sample taken at or after ``t``."""
        return next(v for ts, v in self.samples if ts >= t)

    def full_before(self, t: float) -> dict[str, int]:
        """Every meminfo field of the last sample taken before ``t``."""
        return [m for ts, m in self.full if ts < t][-1]

    def full_after(self, t: float) -> dict[str, int]:
        """Every meminfo field of the first sample taken at or after ``t``."""
        return next(m for ts, m in self.full if ts >= t)

    def used_before(self, t: float) -> int:
        """``MemTotal - MemAvailable`` of the last sample taken before ``t``."""
        return [v for ts, v in self.used if ts < t][-1]

    def used_after(self, t: float) -> int:
        """``MemTotal - MemAvailable`` of the first sample taken at or after ``t``."""
        return next(v for ts, v in self.used if ts >= t)


@dataclass
class Server:
    proc: subprocess.Popen
    port: int
    log: Path
    started: float
    seconds_to_ready: float = 0.0
    tree: list = field(default_factory=list)  # psutil.Process of the server and its descendants at ready

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")


def start(cmd: list[str], log: Path, port: int, env: dict | None = None) -> Server:
    """Start ``cmd`` with its output in ``log`` (new session: SIGTERM goes to it alone)."""
    out = open(log, "wb")
    proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=REPO, env=env or dict(os.environ),
                            start_new_session=True)
    out.close()
    return Server(proc=proc, port=port, log=log, started=time.monotonic())


def serve_cmd(profile: Path, port: int, sets: list[str] = ()) -> list[str]:
    """Native ``escha-deploy serve --profile P --set container.port=PORT --set S...``."""
    cmd = [sys.executable, "-m", "escha_deploy", "serve", "--profile", str(profile), "--set", f"container.port={port}"]
    for s in sets:
        cmd += ["--set", s]
    return cmd


def wait_ready(srv: Server, timeout: float) -> None:
    """Until ``/health`` answers 200; fails the test naming the log's tail when the server exits or
    ``timeout`` seconds pass. Sets ``seconds_to_ready`` and ``tree``."""
    import httpx

    while True:
        if srv.proc.poll() is not None:
            pytest.fail(f"the server exited {srv.proc.returncode} before ready:\n{srv.log_text()[-6000:]}")
        if time.monotonic() - srv.started > timeout:
            pytest.fail(f"not ready in {timeout:.0f} s:\n{srv.log_text()[-6000:]}")
        try:
            if httpx.get(srv.base + "/health", timeout=3).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    srv.seconds_to_ready = round(time.monotonic() - srv.started, 1)
    srv.tree = tree(srv.proc.pid)


def tree(pid: int) -> list:
    import psutil

    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def alive(procs: list) -> list:
    """Those of ``procs`` still running (same pid and start time; zombies count as gone), each once."""
    import psutil

    left, seen = [], set()
    for p in procs:
        if p.pid in seen:
            continue
        seen.add(p.pid)
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                left.append(p)
        except psutil.NoSuchProcess:
            pass
    return left


def kill_all(srv: Server) -> None:
    """What a failed test left: nothing may outlive it."""
    for p in alive(tree(srv.proc.pid) + srv.tree):
        try:
            p.kill()
        except Exception:
            pass
    try:
        srv.proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        pass


def sigterm(srv: Server, wait_s: float = 90) -> dict:
    """SIGTERM to the server's first process, wait for it and its tree: ``{"exit", "seconds",
    "tree", "left"}`` (``left``: ``(pid, name)`` of those still running 15 s after it exited)."""
    import psutil

    procs = alive(tree(srv.proc.pid) + srv.tree)
    t0 = time.monotonic()
    srv.proc.send_signal(signal.SIGTERM)
    try:
        code = srv.proc.wait(timeout=wait_s)
    except subprocess.TimeoutExpired:
        code = None
    gone_s = round(time.monotonic() - t0, 1)
    psutil.wait_procs(procs, timeout=15)
    left = alive(procs)
    return {"exit": code, "seconds": gone_s, "tree": len(procs), "left": [(p.pid, p.name()) for p in left]}


def settle_mem_available(target: int, within: int, timeout: float = 20) -> int:
    """MemAvailable once it is back within ``within`` bytes of ``target`` (the kernel returns a
    dead process's pinned pages asynchronously), or the last reading after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    now = mem_available()
    while now < target - within and time.monotonic() < deadline:
        time.sleep(0.5)
        now = mem_available()
    return now


#: ``serve``'s drift lines (``launch/drift.py: DriftReport.report_lines``): one ``drift:`` warning
#: per figure that differs, else this line with how many figures agreed.
AGREED = re.compile(r"serve: the server's sizes are the plan's \((\d+) figures from its log"
                    r"(?:, (\d+) from /server_info)?\)")


def drift_figures(text: str) -> dict:
    """The drift check's outcome in ``serve``'s log: ``{"drift": [lines], "log": N, "server_info": M}``."""
    m = AGREED.search(text)
    return {"drift": [ln for ln in text.splitlines() if "drift:" in ln],
            "log": int(m.group(1)) if m else 0, "server_info": int(m.group(2) or 0) if m else 0}


def server_info_agreement(base: str, plan: dict) -> dict:
    """``/server_info`` (SGLang: ``entrypoints/http_server.py``; ``/get_server_info`` its older
    name) beside the plan: ``{figure: [planned, reported]}`` for each figure it reports."""
    import httpx

    info = None
    for path in ("/server_info", "/get_server_info"):
        r = httpx.get(base + path, timeout=60)
        if r.status_code == 200:
            info = r.json()
            break
    assert isinstance(info, dict), "neither /server_info nor /get_server_info answered"
    pr = plan["per_rank"]
    pairs = {"max_total_num_tokens": pr["device_kv_tokens"], "max_mamba_cache_size": pr["device_mamba_slots"]}
    return {k: [v, info.get(k)] for k, v in pairs.items() if k in info}


def wait_drift(srv: Server, timeout: float = 30) -> dict:
    """``drift_figures`` of ``serve``'s log once its check at ready has said something (``serve``
    runs it after SGLang's ready line, so it can follow ``/health``'s first 200), or as they are
    after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        fig = drift_figures(srv.log_text())
        if fig["drift"] or fig["log"] or time.monotonic() > deadline:
            return fig
        time.sleep(1)
