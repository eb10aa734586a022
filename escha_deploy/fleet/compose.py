"""``fleet compose``: one compose file per box, dumped by PyYAML and checked with
``docker-compose config`` in the tests.

- A replica box gets the service ``escha-deploy compose`` renders for its profile (the same
  ``ContainerSpec`` as ``up``; ``serve`` plans again inside the container).
- A node of a multi-node instance gets SGLang itself (``python3 -m sglang.launch_server``)
  with that node's argv and environment from ``multinode.render_nodes``: host networking (NCCL
  and Gloo connect on ports they choose), no published port, and a model health check on rank 0
  only (ranks above 0 answer ``/health`` with 200 whatever the model does).
- The router's box also gets ``smg``: the router image with host networking, the API key as a
  compose secret read by ``smg_launch.py`` (never in the command).

The image is not built by these files: every box runs the image ``escha-deploy build`` made (one
digest per instance; ``fleet plan`` compares the saved digests).
"""

from __future__ import annotations

from typing import Any

import yaml

from ..capabilities import LABEL_PREFIX
from .model import LoadedFleet
from .multinode import NodeLaunch, render_nodes
from .plan import FleetPlan
from .router import CONTAINER_KEY_PATH, launch_command, router_args, worker_urls

ROUTER_LAUNCHER = "/usr/local/bin/smg_launch.py"


def _node_service(node: NodeLaunch, image: str, shm_size: int | None, labels: dict[str, str]) -> dict[str, Any]:
    svc: dict[str, Any] = {
        "image": image,
        "container_name": f"escha-{node.instance}-node{node.node_rank}",
        "entrypoint": ["python3", "-m", "sglang.launch_server"],
        "command": list(node.argv),
        "init": True,
        "network_mode": "host",
        "environment": dict(sorted({**node.env, "NO_PROXY": "localhost,127.0.0.1,0.0.0.0,::1"}.items())),
        "ulimits": {"memlock": {"soft": -1, "hard": -1}},
        "deploy": {"resources": {"reservations": {"devices": [{"driver": "nvidia", "capabilities": ["gpu"],
                                                                "count": "all"}]}}},
        "cap_drop": ["ALL"],
        "cap_add": ["IPC_LOCK"],
        "security_opt": ["no-new-privileges"],
        "labels": dict(sorted(labels.items())),
        "stop_signal": "SIGTERM",
        "stop_grace_period": "60s",
        "restart": "no",
    }
    if shm_size:
        svc["shm_size"] = shm_size
    if node.serves_api:
        port = node.argv[node.argv.index("--port") + 1]
        svc["healthcheck"] = {
            "test": ["CMD", "python3", "-c",
                     f"import urllib.request; urllib.request.urlopen('http://127.0.0.1:{port}/health', timeout=5)"],
            "interval": "30s", "timeout": "10s", "retries": 3, "start_period": "1800s"}
    else:
        svc["healthcheck"] = {"disable": True}
    return svc


def render_box(loaded: LoadedFleet, fp: FleetPlan, name: str) -> dict[str, Any]:
    """The compose document (a dict) for box ``name``."""
    from ..launch.compose import render
    from ..launch.prepare import profile_file
    from ..launch_spec import build_launch_spec

    fleet = loaded.fleet
    box = fleet.box(name)
    prof = fp.profile(name)
    bp = fp.box_plan(name)
    services: dict[str, Any] = {}
    secrets: dict[str, Any] = {}
    inst = next((i for i in fleet.instances() if name in i.boxes), None)
    labels = {f"{LABEL_PREFIX}fleet": fleet.name, f"{LABEL_PREFIX}managed-by": "escha-deploy",
              f"{LABEL_PREFIX}box": name}
    if inst is not None and inst.multi_node:
        nodes = render_nodes(inst, [fp.box_plan(b).plan for b in inst.boxes], [fp.profile(b) for b in inst.boxes],
                             [fleet.box(b).address for b in inst.boxes], [fleet.box(b).nic for b in inst.boxes])
        node = nodes[inst.boxes.index(name)]
        if node.serves_api:  # rank 0 listens on the address the router reaches
            i = node.argv.index("--host")
            node = node.model_copy(update={"argv": node.argv[:i + 1] + [box.address] + node.argv[i + 2:]})
        spec = build_launch_spec(bp.plan, prof).container
        services[f"node{node.node_rank}"] = _node_service(
            node, prof.container.image, spec.shm_size_bytes,
            {**labels, f"{LABEL_PREFIX}instance": inst.name, f"{LABEL_PREFIX}node-rank": str(node.node_rank)})
    elif inst is not None:
        ref = loaded.profile_ref(box)
        spec = build_launch_spec(bp.plan, prof, overrides=list(box.set), profile_file=profile_file(ref)).container
        doc = render(spec, build=False)
        svc = doc["services"]["sglang"]
        svc["labels"] = dict(sorted({**svc["labels"], **labels, f"{LABEL_PREFIX}instance": inst.name}.items()))
        services["sglang"] = svc
        secrets.update(doc.get("secrets", {}))
    r = fleet.router
    if r is not None and r.box == name:
        args = router_args(loaded, fp, urls=worker_urls(loaded, fp))
        svc = {
            "image": r.image,
            "container_name": f"escha-{fleet.name}-router",
            "command": launch_command(args, CONTAINER_KEY_PATH if r.api_key_file else None, launcher=ROUTER_LAUNCHER),
            "network_mode": "host",
            "read_only": True,
            "tmpfs": ["/tmp"],
            "cap_drop": ["ALL"],
            "security_opt": ["no-new-privileges"],
            "labels": dict(sorted({**labels, f"{LABEL_PREFIX}role": "router"}.items())),
            "stop_signal": "SIGTERM",
            "restart": "unless-stopped",
        }
        if r.api_key_file:
            key_name = CONTAINER_KEY_PATH.rsplit("/", 1)[-1]
            secrets[key_name] = {"file": str(loaded.resolve(r.api_key_file))}
            svc["secrets"] = [{"source": key_name, "target": key_name}]
        services["smg"] = svc
    doc: dict[str, Any] = {"services": services}
    if secrets:
        doc["secrets"] = secrets
    return doc


def header(loaded: LoadedFleet, name: str) -> str:
    return (f"# Rendered by `escha-deploy fleet compose {loaded.path}` for box {name}; do not edit by hand.\n"
            f"# Copy it to {name} and run `docker compose up -d` (or Debian's docker-compose 1.29) there.\n")


def render_all(loaded: LoadedFleet, fp: FleetPlan) -> dict[str, str]:
    """``{box name: compose YAML text}`` for every box that runs something."""
    out = {}
    for b in loaded.fleet.boxes:
        doc = render_box(loaded, fp, b.name)
        if doc["services"]:
            out[b.name] = header(loaded, b.name) + yaml.safe_dump(doc, sort_keys=False, width=100)
    return out
