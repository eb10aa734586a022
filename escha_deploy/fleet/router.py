"""SGLang's router, SMG (Shepherd Model Gateway, PyPI ``smg`` 1.13.0), in front of the fleet.

``router_args`` renders ``smg launch`` flags (checked in the tests with SMG's own parser,
``smg.launch_router.parse_router_args``); the worker URLs are every instance's rank 0 (ranks
above 0 serve no API). Nothing here routes: SMG does (``cache_aware`` by default: an
approximate prefix tree per worker over the prompt text for HTTP workers, the best match above
``--cache-threshold``, shortest queue when the pool is imbalanced; lightseekorg/smg
``model_gateway/src/policies/cache_aware.rs``).

The API key: SMG 1.13 reads ``--api-key`` from its command line only (no environment variable
or config file for it; ``smg/router_args.py``). It both checks clients' ``Authorization: Bearer``
and is sent to workers. To keep it out of every command line (``/proc/PID/cmdline`` is readable
by every local user) the router starts through ``smg_launch.py``, which reads the key file and
hands the argument list to SMG's own parser inside the process. Labels and logs never carry it.

Health checks: SMG checks ``/health`` every ``--health-check-interval-secs``; SGLang answers 503
until its model is loaded and warmed up. SMG's ``--worker-startup-timeout-secs`` (its default
1800 s) must cover a model load, so the default here is the longest ``container.ready_timeout_s``
of the workers' profiles, at least 1800.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..utils.netaddr import url as http_url
from .model import Instance, LoadedFleet
from .plan import FleetPlan

#: SMG's own default for --worker-startup-timeout-secs (smg/router_args.py ``RouterArgs``).
SMG_DEFAULT_STARTUP_TIMEOUT_S = 1800

#: Where the router container finds the key file (bind-mounted read-only).
CONTAINER_KEY_PATH = "/run/secrets/escha_api_key"


def worker_url(loaded: LoadedFleet, fp: FleetPlan, inst: Instance) -> str:
    """``http://HOST:PORT`` (``http://[V6]:PORT``, RFC 3986) at which the router reaches instance ``inst``'s rank 0, as compose
    and ``fleet up`` run them. PORT is the rank-0 box's ``container.port``. HOST:

    - a single-node replica on the router's own box: ``127.0.0.1``. Its port is published on
      127.0.0.1 unless the profile sets ``container.expose`` (``launch_spec.build_launch_spec``),
      and a port published on 127.0.0.1 takes no connection addressed to the box's LAN address;
      the router runs with host networking, so 127.0.0.1 is the box's own loopback and reaches
      the worker either way. The worker then needs no network exposure (nor an API key).
    - otherwise the box's ``address``: a replica on another box publishes its port on 0.0.0.0
      (``container.expose``, refused by ``fleet plan`` otherwise), and a multi-node rank 0 runs
      with host networking and binds ``--host`` = its box's address.
    """
    fleet = loaded.fleet
    box = fleet.box(inst.boxes[0])
    r = fleet.router
    host = "127.0.0.1" if (r is not None and r.box == box.name and not inst.multi_node) else box.address
    return http_url(host, fp.profile(box.name).container.port)


def worker_urls(loaded: LoadedFleet, fp: FleetPlan) -> list[str]:
    """``worker_url`` of every instance, in instance order."""
    return [worker_url(loaded, fp, inst) for inst in loaded.fleet.instances()]


def startup_timeout_s(loaded: LoadedFleet, fp: FleetPlan) -> int:
    """``--worker-startup-timeout-secs``: the fleet's value, else the longest model-load wait of
    the workers' profiles (``container.ready_timeout_s``), at least SMG's 1800."""
    r = loaded.fleet.router
    if r is not None and r.health.worker_startup_timeout_s:
        return r.health.worker_startup_timeout_s
    longest = max((fp.profile(b.box).container.ready_timeout_s for b in fp.boxes), default=0)
    return max(longest, SMG_DEFAULT_STARTUP_TIMEOUT_S)


#: SMG 1.13's worker overload protection, on by default (`smg launch --help`:
#: --worker-overload-protection "8 waiting requests, 0.8 KV usage"): a worker at or above either
#: threshold is left out of routing while another is under them.
SMG_OVERLOAD_WAITING = 8
SMG_OVERLOAD_TOKEN_USAGE = 0.8


def overload_thresholds(loaded: LoadedFleet, fp: FleetPlan) -> tuple[int, float, list[str]]:
    """``(waiting requests, KV token usage, why)`` for SMG's ``--worker-overload-waiting-requests``
    and ``--worker-overload-token-usage``, from each worker's plan (every instance's rank 0).

    Token usage: one request of a worker's whole context (``runtime.context_length``, else its
    pool) fills ``context / pool`` of its device KV pool (``plan.per_rank.device_kv_tokens``);
    at SMG's 0.8 one long request alone would mark a small box overloaded (24K tokens of a
    28,672-token pool is 0.84). The threshold is the largest such share over the workers plus
    0.05, rounded up to 0.05, at least SMG's 0.8 and at most 1.0 (only a full pool). Waiting
    requests: a whole batch waiting (the largest ``runtime.max_running_requests``), SMG's 8 when
    no worker sets a cap. One router serves every worker, so each threshold is the most lenient
    a worker's plan needs."""
    import math

    shares, caps, why = [], [], []
    for inst in loaded.fleet.instances():
        name = inst.boxes[0]
        plan, prof = fp.box_plan(name).plan, fp.profile(name)
        pool = plan.per_rank.device_kv_tokens
        ctx = min(prof.runtime.context_length or pool, pool) if pool else 0
        if pool:
            shares.append(ctx / pool)
            why.append(f"box {name}: one {ctx:,}-token request fills {ctx / pool:.2f} of its {pool:,}-token KV pool")
        if prof.runtime.max_running_requests:
            caps.append(prof.runtime.max_running_requests)
            why.append(f"box {name}: runs at most {prof.runtime.max_running_requests} requests at once")
    usage = SMG_OVERLOAD_TOKEN_USAGE
    if shares:
        usage = min(1.0, max(usage, math.ceil((max(shares) + 0.05) * 20 - 1e-9) / 20))
    waiting = max(caps) if caps else SMG_OVERLOAD_WAITING
    why.append(f"router: a worker counts as overloaded at {waiting} waiting requests (a whole batch; SMG's default "
               f"{SMG_OVERLOAD_WAITING}) or {usage:g} KV usage (SMG's default {SMG_OVERLOAD_TOKEN_USAGE:g} would leave "
               "out a worker serving one long request)" + (": at 1.0 only a full pool counts" if usage >= 1.0 else ""))
    return waiting, usage, why


@dataclass(frozen=True)
class ServiceDiscovery:
    """SMG's Kubernetes service discovery (``--service-discovery``, ``smg/router_args.py``): the
    router watches the pods matching every ``selector`` item (``key=value``) in ``namespace``
    and reaches each at ``port`` (the workers' ``container.port``), instead of a worker URL list."""

    selector: tuple[str, ...]
    namespace: str
    port: int


def router_args(loaded: LoadedFleet, fp: FleetPlan, *, urls: list[str] | None = None,
                bind_host: str | None = None, prometheus_host: str | None = None,
                discovery: ServiceDiscovery | None = None) -> list[str]:
    """The flags after ``smg launch``, without the API key (``smg_launch.py`` adds it from the
    file), rendered once from the values given. ``urls``: the workers (default ``worker_urls``);
    with ``discovery`` there is no ``--worker-urls`` and SMG finds the workers itself.
    ``bind_host``: the address SMG serves on (default 127.0.0.1, or 0.0.0.0 with
    ``router.expose``); ``prometheus_host``: where its metrics listen (default ``bind_host``)."""
    r = loaded.fleet.router
    if r is None:
        from ..utils.errors import BadInput

        raise BadInput(f"{loaded.path}: router: missing; add a router section to start SMG")
    if discovery is not None and urls is not None:
        raise ValueError("router_args: worker urls and service discovery exclude each other")
    h = r.health
    waiting, usage, _ = overload_thresholds(loaded, fp)
    host = bind_host if bind_host is not None else "0.0.0.0" if r.expose else "127.0.0.1"
    workers = [] if discovery is not None else \
        ["--worker-urls", *(urls if urls is not None else worker_urls(loaded, fp))]
    found = [] if discovery is None else \
        ["--service-discovery", "--selector", *discovery.selector,
         "--service-discovery-namespace", discovery.namespace, "--service-discovery-port", str(discovery.port)]
    return [
        *workers,
        "--policy", r.policy,
        "--host", host, "--port", str(r.port),
        "--cache-threshold", f"{r.cache_threshold:g}",
        "--balance-abs-threshold", str(r.balance_abs_threshold),
        "--balance-rel-threshold", f"{r.balance_rel_threshold:g}",
        "--worker-overload-waiting-requests", str(waiting),
        "--worker-overload-token-usage", f"{usage:g}",
        "--health-check-endpoint", h.endpoint,
        "--health-check-interval-secs", str(h.interval_s),
        "--health-check-timeout-secs", str(h.timeout_s),
        "--health-failure-threshold", str(h.failure_threshold),
        "--health-success-threshold", str(h.success_threshold),
        "--worker-startup-timeout-secs", str(startup_timeout_s(loaded, fp)),
        "--worker-startup-check-interval", str(h.worker_startup_check_interval_s),
        "--prometheus-host", prometheus_host if prometheus_host is not None else host,
        "--prometheus-port", str(r.metrics_port),
        *found,
    ]


def launcher_path() -> Path:
    """``smg_launch.py``: runs with the Python that has ``smg`` (natively, or in the image)."""
    return Path(__file__).with_name("smg_launch.py")


def launch_command(args: list[str], key_file: str | None, python: str = "python3",
                   launcher: str | None = None) -> list[str]:
    """The router's command line: ``python smg_launch.py [--api-key-file F] -- ARGS``; the key
    file's path appears, never the key."""
    cmd = [python, launcher or str(launcher_path())]
    if key_file:
        cmd += ["--api-key-file", key_file]
    return cmd + ["--", *args]
