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
- Files the rendering machine holds and the box needs (key and token files, a profile given as
  a path) are named relative to the compose file (``./router.key``): docker compose resolves a
  relative secret ``file`` or bind ``source`` against the compose file's folder, so the files
  copied next to it on the box are what runs. ``render_box_files`` says which to copy.

The images are not built by these files and no registry holds them: every box runs the image
``escha-deploy build`` made there (one digest per instance; ``fleet plan`` compares the saved
digests), and the router's box the image ``escha-deploy fleet build-router`` made
(``box_images`` names them and the commands, in each file's header and ``fleet compose``'s
instructions).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from ..sglang.capabilities import LABEL_PREFIX
from ..utils.errors import BadInput
from .model import LoadedFleet
from .multinode import NodeLaunch, render_nodes
from .plan import FleetPlan
from .router import CONTAINER_KEY_PATH, launch_command, router_args, worker_urls

ROUTER_LAUNCHER = "/usr/local/bin/smg_launch.py"

#: The compose secret that holds the router's key (mounted at ``router.CONTAINER_KEY_PATH``).
ROUTER_SECRET = "escha_router_api_key"


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
        port = node.port
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

    fleet = loaded.fleet
    prof = fp.profile(name)
    services: dict[str, Any] = {}
    secrets: dict[str, Any] = {}
    volumes: dict[str, Any] = {}  # named volumes the services mount (the JIT cache), declared at the top
    inst = next((i for i in fleet.instances() if name in i.boxes), None)
    labels = {f"{LABEL_PREFIX}fleet": fleet.name, f"{LABEL_PREFIX}managed-by": "escha-deploy",
              f"{LABEL_PREFIX}box": name}
    if inst is not None and inst.multi_node:
        nodes = render_nodes(inst, [fp.box_plan(b).plan for b in inst.boxes], [fp.profile(b) for b in inst.boxes],
                             [fleet.box(b).address for b in inst.boxes], [fleet.box(b).nic for b in inst.boxes],
                             rank0_binds_address=True)  # rank 0 listens on the address the router reaches
        node = nodes[inst.boxes.index(name)]
        spec = fp.launch(name).container
        services[f"node{node.node_rank}"] = _node_service(
            node, prof.container.image, spec.shm_size_bytes,
            {**labels, f"{LABEL_PREFIX}instance": inst.name, f"{LABEL_PREFIX}node-rank": str(node.node_rank)})
    elif inst is not None:
        doc = render(fp.launch(name).container, build=False)  # the container the box's plan rendered
        svc = doc["services"]["sglang"]
        svc["labels"] = dict(sorted({**svc["labels"], **labels, f"{LABEL_PREFIX}instance": inst.name}.items()))
        services["sglang"] = svc
        secrets.update(doc.get("secrets", {}))
        volumes.update(doc.get("volumes", {}))
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
            # its own secret name: the replica on this box may mount another key file as
            # escha_api_key (same target path, another container)
            secrets[ROUTER_SECRET] = {"file": str(loaded.resolve(r.api_key_file))}
            svc["secrets"] = [{"source": ROUTER_SECRET, "target": CONTAINER_KEY_PATH.rsplit("/", 1)[-1]}]
        services["smg"] = svc
    doc: dict[str, Any] = {"services": services}
    if volumes:
        doc["volumes"] = volumes
    if secrets:
        doc["secrets"] = secrets
    return doc


def localize(doc: dict[str, Any], box: str, base: Path | None = None) -> dict[str, str]:
    """Rewrite, in place, every file of the rendering machine that ``doc`` names (secret
    ``file``s, bind mounts of a profile file) as ``./NAME`` next to the compose file; returns
    ``{NAME: absolute path here}``, the files to copy next to it. A relative path is read against
    ``base`` (the fleet file's folder, as every path in the fleet file is; default: the current
    folder), and paths are compared once resolved, so one file named twice (``router.key`` and
    its absolute path) is copied once. A named file that does not exist on this machine is taken
    as a path on the box and kept; model and L3 folders are the profile's paths on the box and
    stay as they are. ``BadInput`` when two different files share a name."""
    from ..launch.docker import PROFILE_TARGET

    files: dict[str, str] = {}

    def local(src: str) -> str:
        p = Path(src).expanduser()
        if not p.is_absolute() and base is not None:
            p = base / p
        if not p.is_file():  # not on this machine: a path on the box, kept as written
            return src
        here = str(p.resolve())
        name = p.name
        if files.setdefault(name, here) != here:
            raise BadInput(f"box {box}: {files[name]} and {here} would both be copied as {name} next to its "
                           "compose file; rename one of them")
        return f"./{name}"

    for sec in doc.get("secrets", {}).values():
        sec["file"] = local(sec["file"])
    for svc in doc["services"].values():
        for vol in svc.get("volumes", []):
            if isinstance(vol, dict) and vol.get("target") == PROFILE_TARGET:
                vol["source"] = local(vol["source"])
    return files


def box_images(loaded: LoadedFleet, fp: FleetPlan, name: str) -> dict[str, str]:
    """``{image: the command that makes it}`` for every image box ``name``'s compose file runs.
    No registry holds them and the files have no ``build:`` section, so each must be on the box
    before ``docker compose up``: the server's image from ``escha-deploy build`` (``--hicache``
    when the profile needs capabilities of our series, ``runtime.needs``; else ``--stock``), run
    in an escha-deploy checkout; the router's from ``escha-deploy fleet build-router``."""
    fleet = loaded.fleet
    out: dict[str, str] = {}
    if any(name in i.boxes for i in fleet.instances()):
        prof = fp.profile(name)
        flavor = "--hicache" if prof.runtime.needs else "--stock"
        image = prof.container.image
        out[image] = f"escha-deploy build {flavor} --context CHECKOUT --tag {image}"
    r = fleet.router
    if r is not None and r.box == name:
        out.setdefault(r.image, f"escha-deploy fleet build-router --base-image IMAGE --tag {r.image}")
    return out


def header(loaded: LoadedFleet, name: str, files: dict[str, str], images: dict[str, str] | None = None) -> str:
    lines = [f"# Rendered by `escha-deploy fleet compose {loaded.path}` for box {name}; do not edit by hand."]
    if images:
        lines.append(f"# {name} needs these images first (this file builds none and no registry holds them):")
        lines += [f"#   {image}: `{cmd}`" for image, cmd in images.items()]
    lines.append(f"# Copy it to a folder on {name}{', with these files next to it:' if files else ''}")
    lines += [f"#   {n}  (here: {src})" for n, src in files.items()]
    lines.append("# and run `docker compose -f THIS_FILE up -d` (or Debian's docker-compose 1.29) there.")
    return "\n".join(lines) + "\n"


def render_box_files(loaded: LoadedFleet, fp: FleetPlan) -> dict[str, tuple[str, dict[str, str]]]:
    """``{box name: (compose YAML text, {file name: path here})}`` for every box that runs
    something; the files are the ones to copy next to the compose file on the box."""
    out = {}
    for b in loaded.fleet.boxes:
        doc = render_box(loaded, fp, b.name)
        if doc["services"]:
            files = localize(doc, b.name, Path(loaded.path).parent)
            out[b.name] = (header(loaded, b.name, files, box_images(loaded, fp, b.name)) + yaml.safe_dump(doc, sort_keys=False, width=100), files)
    return out


def render_all(loaded: LoadedFleet, fp: FleetPlan) -> dict[str, str]:
    """``{box name: compose YAML text}`` for every box that runs something."""
    return {b: text for b, (text, _) in render_box_files(loaded, fp).items()}
