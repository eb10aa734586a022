"""The real SMG 1.13.0 router (the ``smg`` wheel's binary, started by ``fleet up --router``) in
front of two STAND-IN SGLang servers (tests/bench/standin_sglang.py: no GPU here).

What SMG does is SMG's: registration, health checks, routing. The test checks that the fleet
starts it right (flags, key from a file, waits for healthy workers) and that the behaviour the
docs promise holds: requests flow; a shared long prefix sticks to one worker under cache_aware;
a stopped worker is marked unhealthy and, once SMG noticed, no client request fails; a restarted
worker is re-admitted. It prints which policy routed what (run with ``-s`` to see it).
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import os
import re
import socket
import threading
import time
from pathlib import Path

import httpx
import pytest
import yaml

from escha_deploy.cli.main import main
from escha_deploy.fleet.model import load_fleet
from escha_deploy.fleet.plan import plan_fleet
from escha_deploy.fleet.router import router_args
from escha_deploy.fleet.router_run import log_file, native_pid, router_workers, stop_router


def _load_standin():
    """The bench tests' stand-in module, loaded from its file (tests/ is not a package)."""
    import importlib.util as iu
    import sys

    path = Path(__file__).resolve().parents[1] / "bench" / "standin_sglang.py"
    spec = iu.spec_from_file_location("standin_sglang_fleet", path)
    mod = iu.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up by name
    spec.loader.exec_module(mod)
    return mod


_standin = _load_standin()
StandinConfig, StandinServer = _standin.StandinConfig, _standin.StandinServer

pytestmark = pytest.mark.skipif(importlib.util.find_spec("smg") is None,
                                reason="smg 1.13.0 not installed (.ci/test installs it)")

KEY = "fleet-test-key-5d1c"
PROFILE = "rtx5060ti-tp2-fp8"


#: This run's id (``ESCHA_TEST_RUN``, else the pid) is in the name of every fleet these tests
#: make, with a number of its own per fleet: the router's container (``escha-<fleet>-router``),
#: pid and log files are named after the fleet, and another run of the suite starts its own at
#: the same time on this machine's one Docker daemon.
RUN = re.sub(r"[^a-z0-9]+", "-", (os.environ.get("ESCHA_TEST_RUN") or f"r{os.getpid()}").lower()).strip("-")[:16]
_fleet_numbers = itertools.count()


@pytest.fixture(scope="module", autouse=True)
def own_state_dir(tmp_path_factory):
    """The routers of this module keep their pid and log files in a cache directory of this run,
    so a router another run of these tests started on this machine is never taken for one of
    this run's (and each fleet's name is its own: one test's router is never the next's)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("xdg-cache")))
        yield


@pytest.fixture(scope="module")
def stop_later(own_state_dir):
    """``stop_later(loaded)``: ``stop_router(loaded)`` in a thread of its own, so the next test
    runs while SMG shuts down: after SIGTERM it keeps its listener open for its drain settle time
    (5 s, the Rust core's ``drain_settle_secs``, which ``smg/router_args.py`` leaves at its
    default; SMG logs "Keeping listener open during load-balancer propagation window"). At the
    module's end every stop is joined: each must have returned without an error and left no
    router process of its fleet."""
    stops: list[tuple[object, threading.Thread, list]] = []

    def stop(loaded) -> None:
        errors: list = []

        def run() -> None:
            try:
                stop_router(loaded)
            except BaseException as exc:  # reported at the module's end
                errors.append(exc)

        t = threading.Thread(target=run, name=f"stop-router-{loaded.fleet.name}")
        t.start()
        stops.append((loaded, t, errors))

    yield stop
    problems = []
    for loaded, t, errors in stops:
        t.join(timeout=60)
        if t.is_alive():
            problems.append(f"{loaded.fleet.name}: stop_router still running after 60 s")
        problems += [f"{loaded.fleet.name}: stop_router raised {exc!r}" for exc in errors]
        if native_pid(loaded) is not None:
            problems.append(f"{loaded.fleet.name}: the router (pid {native_pid(loaded)}) still runs")
    assert problems == []


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def fleet_file(tmp: Path, ports: list[int], policy: str, router_port: int) -> Path:
    (tmp / "router.key").write_text(KEY + "\n")
    doc = {
        "name": f"t-{policy.replace('_', '-')}-{RUN}-{next(_fleet_numbers)}",
        "boxes": [{"name": f"w{i}", "address": "127.0.0.1", "profile": PROFILE, "host_ram": "64GiB",
                   "set": [f"container.port={p}"]} for i, p in enumerate(ports)],
        "router": {"box": "w0", "port": router_port, "metrics_port": free_port(), "policy": policy,
                   "api_key_file": "router.key", "run": "native",
                   "health": {"interval_s": 1, "timeout_s": 2, "failure_threshold": 2, "success_threshold": 1,
                              "worker_startup_timeout_s": 60, "worker_startup_check_interval_s": 1}},
    }
    path = tmp / "fleet.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def cli(*args: str) -> int:
    try:
        main(list(args))
        return 0
    except SystemExit as exc:
        return int(exc.code or 0)


def completions(srv: StandinServer) -> int:
    return sum(1 for p in srv.state.paths if p == "/v1/completions")


class Client:
    def __init__(self, url: str) -> None:
        self.http = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {KEY}"}, timeout=30)

    def complete(self, prompt: str) -> int:
        r = self.http.post("/v1/completions", json={"model": "standin-hybrid-27b", "prompt": prompt, "max_tokens": 4})
        return r.status_code


def wait_for(pred, timeout: float, what: str) -> float:
    t0 = time.monotonic()
    while not pred():
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.2)
    return time.monotonic() - t0


def smg_errors(log: Path) -> list[str]:
    text = re.sub(r"\x1b\[[0-9;]*m", "", log.read_text(errors="replace"))
    return [ln for ln in text.splitlines() if re.search(r"\bERROR\b", ln)]


def _two_workers(load_seconds: float):
    # port 0: the kernel picks and binds at once (a free_port() probe can lose its port to a
    # parallel test before the server binds it)
    servers = [StandinServer(StandinConfig(load_seconds=load_seconds)).start(0) for _ in range(2)]
    ports = [s.port for s in servers]
    yield ports, servers
    for s in servers:
        s.stop()


@pytest.fixture
def workers():
    # a model load of 3 s: /health answers 503 until then (SMG checks every 1 s: it sees the 503)
    yield from _two_workers(3.0)


@pytest.fixture
def loaded_workers():
    """Two workers whose load takes 0.5 s, for a test that does not look at the load."""
    yield from _two_workers(0.5)


def test_rendered_router_flags_pass_smgs_own_parser(tmp_path):
    from smg.launch_router import parse_router_args

    loaded = load_fleet(fleet_file(tmp_path, [31001, 31002], "cache_aware", 30080))
    args = router_args(loaded, plan_fleet(loaded))
    parsed = parse_router_args(args)
    assert parsed.worker_urls == ["http://127.0.0.1:31001", "http://127.0.0.1:31002"]
    assert parsed.policy == "cache_aware" and parsed.health_check_interval_secs == 1
    assert parsed.worker_startup_timeout_secs == 60 and parsed.host == "127.0.0.1"
    assert KEY not in " ".join(args) and parsed.api_key is None


def test_router_args_render_discovery_and_hosts_as_given(tmp_path):
    # Kubernetes' router: no worker list, SMG's service discovery, every address bound; each
    # value is rendered once where it is given (SMG's own parser reads them back)
    from smg.launch_router import parse_router_args

    from escha_deploy.fleet.router import ServiceDiscovery

    loaded = load_fleet(fleet_file(tmp_path, [31001, 31002], "cache_aware", 30080))
    fp = plan_fleet(loaded)
    found = ServiceDiscovery(selector=("io.escha/fleet=lab", "io.escha/serve=true"), namespace="llm", port=31001)
    args = router_args(loaded, fp, bind_host="0.0.0.0", prometheus_host="::1", discovery=found)
    parsed = parse_router_args(args)
    assert "--worker-urls" not in args and parsed.worker_urls == []
    assert (parsed.host, parsed.prometheus_host) == ("0.0.0.0", "::1")
    assert parsed.service_discovery and parsed.service_discovery_namespace == "llm"
    assert parsed.selector == {"io.escha/fleet": "lab", "io.escha/serve": "true"}
    assert parsed.service_discovery_port == 31001
    plain = parse_router_args(router_args(loaded, fp))  # defaults: loopback for both, the worker list
    assert (plain.host, plain.prometheus_host, plain.service_discovery) == ("127.0.0.1", "127.0.0.1", False)
    with pytest.raises(ValueError):
        router_args(loaded, fp, urls=["http://127.0.0.1:31001"], discovery=found)


def test_cache_aware_router_in_front_of_two_workers(tmp_path, workers, capsys, stop_later):
    ports, (a, b) = workers
    router_port = free_port()
    path = fleet_file(tmp_path, ports, "cache_aware", router_port)
    loaded = load_fleet(path)
    report: list[str] = []
    try:
        t0 = time.monotonic()
        assert cli("fleet", "up", str(path), "--router") == 0
        report.append(f"router ready in {time.monotonic() - t0:.1f} s (workers loaded for 3 s)")
        # SMG saw the workers load: /health answered 503 before 200
        assert 503 in a.state.health_codes and 503 in b.state.health_codes
        pid = native_pid(loaded)
        assert pid is not None
        assert KEY not in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
        # registration: every endpoint SMG 1.13 called was answered by the stand-in
        for srv in (a, b):
            assert {"/health", "/v1/models", "/server_info", "/model_info"} <= set(srv.state.paths)
        client = Client(f"http://127.0.0.1:{router_port}")
        no_key = httpx.post(f"http://127.0.0.1:{router_port}/v1/completions",
                            json={"model": "standin-hybrid-27b", "prompt": "hi", "max_tokens": 2})
        assert no_key.status_code == 401  # SMG checks the clients' key

        # 1. requests flow (distinct short prompts)
        codes = [client.complete(f"question number {i} about rivers") for i in range(6)]
        assert codes == [200] * 6
        report.append(f"cache_aware, 6 distinct prompts: worker A {completions(a)}, worker B {completions(b)}")

        # 2. a shared long prefix lands on one worker
        before = (completions(a), completions(b))
        prefix = "You are a careful assistant. " + " ".join(f"rule {i}: answer briefly." for i in range(150))
        codes = [client.complete(prefix + f" Question {i}: what is {i} plus {i}?") for i in range(8)]
        assert codes == [200] * 8
        got = (completions(a) - before[0], completions(b) - before[1])
        report.append(f"cache_aware, 8 prompts sharing a {len(prefix)}-char prefix: worker A {got[0]}, worker B {got[1]}")
        assert sorted(got) == [0, 8], got

        # 3. stop worker A: SMG marks it unhealthy; afterwards no client request fails
        a.stop()
        waited = wait_for(lambda: any(w.url.endswith(f":{ports[0]}") and not w.healthy
                                      for w in router_workers(loaded).workers), 30, "SMG to mark A unhealthy")
        report.append(f"worker A stopped: SMG marked it unhealthy after {waited:.1f} s")
        b_before = completions(b)
        codes = [client.complete(prefix + f" After the stop {i}?") for i in range(6)]
        codes += [client.complete(f"unrelated prompt {i}") for i in range(4)]
        assert codes == [200] * 10, codes
        assert completions(b) - b_before == 10
        report.append("after the router noticed: 10 requests, 10 answered (all by worker B), 0 failed")
        assert cli("fleet", "status", str(path)) == 3  # one worker is not healthy

        # 4. restart A on its port: re-admitted
        a2 = StandinServer(StandinConfig()).start(ports[0])
        try:
            waited = wait_for(lambda: router_workers(loaded, [f"http://127.0.0.1:{p}" for p in ports]).ready,
                              30, "SMG to re-admit A")
            report.append(f"worker A restarted: re-admitted after {waited:.1f} s")
            capsys.readouterr()
            assert cli("fleet", "status", str(path), "--format", "json") == 0
            st = json.loads(capsys.readouterr().out)
            assert st["ready"] and all(w["healthy"] for w in st["workers"]) and len(st["workers"]) == 2
            codes = [client.complete(f"fresh prompt {i} about amber") for i in range(8)]
            assert codes == [200] * 8
            report.append(f"after re-admission, 8 distinct prompts: worker A {completions(a2)}, "
                          f"worker B {completions(b) - b_before - 10}")
            # the shared prefix again: cache_aware still sends it all to one worker. Which one is
            # SMG's choice (step 2 may have given the prefix to either worker, and B served it while
            # A was down), so the test asserts the grouping, not the worker.
            a_before, b_mid = completions(a2), completions(b)
            codes = [client.complete(prefix + f" Question {i}: what is {i} plus {i}?") for i in range(4)]
            assert codes == [200] * 4
            again = (completions(a2) - a_before, completions(b) - b_mid)
            report.append(f"after re-admission, 4 prompts with the shared prefix: worker A {again[0]}, "
                          f"worker B {again[1]}")
            assert sorted(again) == [0, 4], again
        finally:
            a2.stop()
        assert smg_errors(log_file(loaded)) == []
        assert KEY not in log_file(loaded).read_text(errors="replace")
    finally:
        stop_later(loaded)
        with capsys.disabled():
            print("\n" + "\n".join(f"[smg cache_aware] {line}" for line in report))


def test_round_robin_spreads_the_same_prefix(tmp_path, loaded_workers, capsys, stop_later):
    """The contrast: with round_robin the shared prefix goes to both workers."""
    ports, (a, b) = loaded_workers
    router_port = free_port()
    path = fleet_file(tmp_path, ports, "round_robin", router_port)
    loaded = load_fleet(path)
    try:
        assert cli("fleet", "up", str(path), "--router") == 0
        client = Client(f"http://127.0.0.1:{router_port}")
        prefix = "Shared system prompt. " * 100
        assert [client.complete(prefix + f"q{i}") for i in range(8)] == [200] * 8
        got = (completions(a), completions(b))
        assert got == (4, 4), got
        assert smg_errors(log_file(loaded)) == []
    finally:
        stop_later(loaded)
        with capsys.disabled():
            print(f"\n[smg round_robin] 8 prompts sharing a prefix: worker A {got[0]}, worker B {got[1]}")


def test_router_start_fails_with_exit_4_when_workers_never_load(tmp_path, stop_later):
    """Workers that stay at 503 past the startup timeout: fleet up exits 4 naming them."""
    servers = [StandinServer(StandinConfig(load_seconds=3600)).start(0) for _ in range(2)]
    ports = [s.port for s in servers]
    path = fleet_file(tmp_path, ports, "cache_aware", free_port())
    doc = yaml.safe_load(path.read_text())
    doc["router"]["health"]["worker_startup_timeout_s"] = 3
    path.write_text(yaml.safe_dump(doc))
    loaded = load_fleet(path)
    try:
        assert cli("fleet", "up", str(path), "--router") == 4
    finally:
        stop_later(loaded)
        for s in servers:
            s.stop()


def local_lan_address() -> str | None:
    """An IPv4 address of this machine other than loopback (what a box's ``address`` is), from
    ``ip -4 -o addr show scope global``; None when there is none."""
    import shutil
    import subprocess

    if shutil.which("ip") is None:
        return None
    out = subprocess.run(["ip", "-4", "-o", "addr", "show", "scope", "global"], capture_output=True, text=True).stdout
    addrs = [f.split("/")[0] for line in out.splitlines() for i, f in enumerate(line.split())
             if i and line.split()[i - 1] == "inet"]
    return addrs[0] if addrs else None


def test_router_reaches_the_worker_on_its_own_box_published_on_loopback(tmp_path, stop_later):
    """The router's box serves a replica whose profile does not expose it: compose and `up`
    publish its port on 127.0.0.1 only. The box's address is this machine's LAN address, so the
    situation is the real one: a connection to ADDRESS:PORT is refused (checked first), and
    the real SMG, started by `fleet up --router`, must register the worker through 127.0.0.1."""
    lan = local_lan_address()
    if lan is None:
        pytest.skip("this machine has no non-loopback IPv4 address")
    srv = StandinServer(StandinConfig(load_seconds=0.5)).start(0)  # 127.0.0.1 only, as published
    port = srv.port
    path = fleet_file(tmp_path, [port], "cache_aware", free_port())
    doc = yaml.safe_load(path.read_text())
    doc["boxes"][0]["address"] = lan
    doc["router"]["health"]["worker_startup_timeout_s"] = 15
    path.write_text(yaml.safe_dump(doc))
    loaded = load_fleet(path)
    try:
        with pytest.raises(httpx.ConnectError):  # the premise: not reachable at the box's address
            httpx.get(f"http://{lan}:{port}/health", timeout=3)
        assert router_args(loaded, plan_fleet(loaded))[:2] == ["--worker-urls", f"http://127.0.0.1:{port}"]
        assert cli("fleet", "up", str(path), "--router") == 0
        state = router_workers(loaded)
        assert [(w.url, w.healthy) for w in state.workers] == [(f"http://127.0.0.1:{port}", True)]
        assert cli("fleet", "status", str(path)) == 0
        assert smg_errors(log_file(loaded)) == []
    finally:
        stop_later(loaded)
        srv.stop()
