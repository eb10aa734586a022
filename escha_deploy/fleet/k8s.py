"""``fleet render k8s``: Kubernetes manifests for the fleet, as plain dicts dumped by PyYAML.

Per group:

- ``nodes: 1`` (replicas): a **Deployment** of ``escha-deploy serve`` pods, or a **StatefulSet**
  when the profile's HiCache uses the file L3 backend (each replica keeps its own L3 volume
  from a ``volumeClaimTemplate``, sized at the plan's disk need: each owning rank's cap x those
  ranks + the watermark, ``planner.disk``; a profile without a cap is refused, as a file L3 is
  never shared between instances). The profile
  travels in a ConfigMap (mounted at ``/etc/escha/profile.yaml``) and ``serve`` plans again in
  the pod, as in a container.
- ``nodes: N``: a **LeaderWorkerSet** (kubernetes-sigs/lws; ``leaderworkerset.x-k8s.io/v1``):
  one LWS group per instance, ``size`` = N, ``restartPolicy: RecreateGroupOnPodRestart``
  (NCCL cannot re-admit one restarted rank: the whole group restarts), every pod runs SGLang
  with ``--dist-init-addr $(LWS_LEADER_ADDRESS):PORT --nnodes $(LWS_GROUP_SIZE) --node-rank
  $(LWS_WORKER_INDEX)`` (the shape of lws ``docs/examples/sglang/lws.yaml``), and a leader
  Service. Model health probes on the leader only (workers answer ``/health`` with 200 always).

Every server pod requests ``nvidia.com/gpu`` = its GPUs (the profile's ``tp_size``), sets the
runtime class when the fleet names one, a memory request = limit (Guaranteed QoS) of pinned
host pools + server processes + ``/dev/shm`` from the box's plan (pinned memory counts against
the pod's cgroup), a startup probe as long as the profile's model-load wait, and a
memory-backed ``/dev/shm``. Pods cannot set a memlock ulimit: the manifests assume the node's
container runtime starts containers with an unlimited ``RLIMIT_MEMLOCK`` (containerd's and
Docker's systemd units set ``LimitMEMLOCK=infinity``) and add ``IPC_LOCK``; the assumption is
written into each pod's annotations.

The router is an SMG **Deployment** with Kubernetes service discovery (``--service-discovery
--selector ...``: pods labelled ``io.escha/serve=true`` of this fleet, i.e. single-node servers
and LWS leaders), a ServiceAccount with a Role to get/list/watch pods and its RoleBinding, and a
Service. Secrets are ``secretKeyRef``/Secret volume references, never values.
"""

from __future__ import annotations

import math
import re
from typing import Any

from ..utils.errors import BadInput
from ..pipeline.spec import SECRET_API_KEY_PATH, SECRET_HF_TOKEN_PATH
from .model import Group, LoadedFleet
from .plan import FleetPlan
from .router import CONTAINER_KEY_PATH, ServiceDiscovery, launch_command, router_args

LWS_API = "leaderworkerset.x-k8s.io/v1"
SHM_BYTES = 2 * 2**30
MEMLOCK_ASSUMPTION = ("pods cannot set RLIMIT_MEMLOCK: this pod assumes the node's container runtime starts it "
                      "unlimited (containerd/Docker systemd units: LimitMEMLOCK=infinity); pinned host pools need it")
PROBE_PERIOD_S = 10
ROUTER_LAUNCHER = "/usr/local/bin/smg_launch.py"


def _mi(n: int) -> str:
    return f"{math.ceil(n / 2**20)}Mi"


def _labels(fleet: str, group: str, **extra: str) -> dict[str, str]:
    return {"app.kubernetes.io/part-of": fleet, "app.kubernetes.io/managed-by": "escha-deploy",
            "io.escha/fleet": fleet, "io.escha/group": group, **extra}


def _group_plans(fp: FleetPlan, g: Group):
    """The group's box plan with the smallest per-rank host pools: every pod of the group runs
    it (Kubernetes places pods on any node; the group's boxes describe its node types)."""
    plans = [fp.box_plan(b) for b in g.boxes]
    return min(plans, key=lambda bp: bp.plan.per_rank.pinned_bytes)


def _memory(bp) -> int:
    """The pod's memory (request = limit): the plan's pinned host pools + server processes + OS
    reserve + page-cache floor + ``/dev/shm``. With the reserves inside the limit, ``serve``'s
    plan in the pod (whose memory base is the cgroup limit) finds the same pinned budget as the
    box's plan."""
    p = bp.plan
    b = p.budget
    return p.pinned_total_bytes + b.server_processes_bytes + b.os_reserve_bytes + b.page_cache_floor_bytes + SHM_BYTES


def _pod_common(loaded: LoadedFleet, bp, prof) -> tuple[dict, dict, list, list]:
    """(resources, securityContext, volumes, volumeMounts) every server pod shares."""
    k = loaded.fleet.kubernetes
    mem = _mi(_memory(bp))
    gpus = str(prof.runtime.tp_size)
    resources = {"requests": {"nvidia.com/gpu": gpus, "memory": mem}, "limits": {"nvidia.com/gpu": gpus, "memory": mem}}
    security = {"capabilities": {"drop": ["ALL"], "add": ["IPC_LOCK"]}, "allowPrivilegeEscalation": False}
    volumes: list[dict] = [{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": _mi(SHM_BYTES)}}]
    mounts: list[dict] = [{"name": "dshm", "mountPath": "/dev/shm"}]
    if k.model_pvc:
        volumes.append({"name": "model", "persistentVolumeClaim": {"claimName": k.model_pvc, "readOnly": True}})
        mounts.append({"name": "model", "mountPath": prof.model.path, "readOnly": True})
    elif prof.model.host_dir:
        volumes.append({"name": "model", "hostPath": {"path": prof.model.host_dir, "type": "Directory"}})
        mounts.append({"name": "model", "mountPath": prof.model.path, "readOnly": True})
        from escha_deploy.facts.folders import hf_blobs_mount

        blobs = hf_blobs_mount(prof.model.host_dir, prof.model.path)
        if blobs is not None:  # a Hugging Face cache snapshot: its links point into ../../blobs
            volumes.append({"name": "model-blobs", "hostPath": {"path": blobs[0], "type": "Directory"}})
            mounts.append({"name": "model-blobs", "mountPath": blobs[1], "readOnly": True})
    draft = prof.model.draft
    if draft is not None and draft.host_dir and draft.path != prof.model.path:
        # the speculative draft's folder, as the container mounts it (launch_spec.container_spec)
        volumes.append({"name": "draft", "hostPath": {"path": draft.host_dir, "type": "Directory"}})
        mounts.append({"name": "draft", "mountPath": draft.path, "readOnly": True})
    return resources, security, volumes, mounts


def _probes(port: int, ready_timeout_s: int) -> dict[str, Any]:
    """Startup probe as long as the model load (``container.ready_timeout_s``), then readiness.
    SGLang's ``/health`` runs a 1-token generation (timeout 20 s, ``SGLANG_HEALTH_CHECK_TIMEOUT``)."""
    get = {"httpGet": {"path": "/health", "port": port}}
    return {
        "startupProbe": {**get, "periodSeconds": PROBE_PERIOD_S, "timeoutSeconds": 25,
                         "failureThreshold": max(1, math.ceil(ready_timeout_s / PROBE_PERIOD_S))},
        "readinessProbe": {**get, "periodSeconds": 30, "timeoutSeconds": 25, "failureThreshold": 3},
    }


def _pod_spec(loaded: LoadedFleet, containers: list[dict], volumes: list[dict], *,
              service_account: str | None = None) -> dict[str, Any]:
    k = loaded.fleet.kubernetes
    spec: dict[str, Any] = {"containers": containers, "volumes": volumes, "terminationGracePeriodSeconds": 60}
    if k.runtime_class:
        spec["runtimeClassName"] = k.runtime_class
    if service_account:
        spec["serviceAccountName"] = service_account
    return spec


def _single_node(loaded: LoadedFleet, fp: FleetPlan, g: Group, n_instances: int) -> list[dict]:
    from ..profile import profile_to_data

    fleet, k = loaded.fleet, loaded.fleet.kubernetes
    bp = _group_plans(fp, g)
    prof = fp.profile(bp.box)
    name = f"{fleet.name}-{g.name}"
    port = prof.container.port
    resources, security, volumes, mounts = _pod_common(loaded, bp, prof)
    labels = _labels(fleet.name, g.name, **{"io.escha/serve": "true"})
    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"{name}-profile", "namespace": k.namespace,
                                                                 "labels": _labels(fleet.name, g.name)},
          "data": {"profile.yaml": __import__("yaml").safe_dump(profile_to_data(prof), sort_keys=False)}}
    volumes.append({"name": "profile", "configMap": {"name": f"{name}-profile"}})
    mounts.append({"name": "profile", "mountPath": "/etc/escha/profile.yaml", "subPath": "profile.yaml",
                   "readOnly": True})
    sets = ["--set", f"container.port={port}"]
    secret_items = [{"key": "api-key", "path": SECRET_API_KEY_PATH.rsplit("/", 1)[-1]}]
    volumes.append({"name": "secrets", "projected": {"sources": [{"secret": {"name": k.api_key_secret,
                                                                            "items": secret_items}}]}})
    sets += ["--set", f"container.api_key_file={SECRET_API_KEY_PATH}"]
    if k.hf_token_secret:
        volumes[-1]["projected"]["sources"].append({"secret": {"name": k.hf_token_secret, "items": [
            {"key": "token", "path": SECRET_HF_TOKEN_PATH.rsplit("/", 1)[-1]}]}})
        sets += ["--set", f"container.hf_token_file={SECRET_HF_TOKEN_PATH}"]
    mounts.append({"name": "secrets", "mountPath": "/run/secrets", "readOnly": True})
    l3 = prof.hicache.storage_backend_is_file
    container = {
        "name": "sglang", "image": prof.container.image,
        "command": ["escha-deploy", "serve"], "args": ["--profile", "/etc/escha/profile.yaml", *sets],
        "env": [{"name": "ESCHA_SERVE_MODE", "value": "container"},
                {"name": "NO_PROXY", "value": "localhost,127.0.0.1,0.0.0.0,::1"}],
        "ports": [{"name": "http", "containerPort": port}],
        "resources": resources, "securityContext": security, "volumeMounts": mounts,
        **_probes(port, prof.container.ready_timeout_s),
    }
    template = {"metadata": {"labels": labels, "annotations": {"io.escha/memlock": MEMLOCK_ASSUMPTION}},
                "spec": _pod_spec(loaded, [container], volumes)}
    meta = {"name": name, "namespace": k.namespace, "labels": labels}
    selector = {"matchLabels": {"io.escha/fleet": fleet.name, "io.escha/group": g.name}}
    if l3:
        from ..pipeline.argv import CONTAINER_L3_DIR

        mounts.append({"name": "l3", "mountPath": CONTAINER_L3_DIR})
        disk = bp.plan.l3_disk
        if disk is None or disk.need_bytes is None:  # no cap: the store grows until the volume is full
            raise BadInput(f"hicache.l3.max_size: group {g.name}'s profile {prof.name} has a file L3 store without a "
                           f"cap, so its volume has no size: set hicache.l3.max_size (per rank)")
        size = disk.need_bytes  # each owning rank's cap x those ranks + the watermark (planner.disk)
        workload = {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": meta,
                    "spec": {"replicas": n_instances, "serviceName": name, "selector": selector, "template": template,
                             "volumeClaimTemplates": [{"metadata": {"name": "l3"}, "spec": {
                                 "accessModes": ["ReadWriteOnce"],
                                 "resources": {"requests": {"storage": _mi(size)}}}}]}}
    else:
        workload = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta,
                    "spec": {"replicas": n_instances, "selector": selector, "template": template,
                             "strategy": {"type": "Recreate"}}}
    service = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": k.namespace,
                                                                   "labels": _labels(fleet.name, g.name)},
               "spec": {"selector": selector["matchLabels"], "ports": [{"name": "http", "port": port,
                                                                          "targetPort": port}],
                        **({"clusterIP": "None"} if l3 else {})}}
    return [cm, workload, service]


def _multi_node(loaded: LoadedFleet, fp: FleetPlan, g: Group, n_instances: int) -> list[dict]:
    from ..pipeline import argv as flags
    from ..pipeline import check_rendered_argv

    fleet, k = loaded.fleet, loaded.fleet.kubernetes
    bp = _group_plans(fp, g)
    prof = fp.profile(bp.box)
    name = f"{fleet.name}-{g.name}"
    port = prof.container.port
    local = prof.runtime.tp_size
    tp, pp = (local, g.nodes) if g.parallel == "pp" else (local * g.nodes, 1)
    # the node count and rank are LeaderWorkerSet's, filled in each pod
    node = flags.MultiNode(nnodes="$(LWS_GROUP_SIZE)", node_rank="$(LWS_WORKER_INDEX)",
                           dist_init_addr=f"$(LWS_LEADER_ADDRESS):{g.dist_init_port}", tp_size=tp, pp_size=pp,
                           dist_timeout_s=g.dist_timeout_s)
    argv = flags.server_args(bp.plan, prof, host="0.0.0.0", multinode=node)
    # the argv each pod runs, checked against the release's flag catalog with the values
    # LeaderWorkerSet fills in (its leader's: rank 0 of g.nodes; BadArgv, exit 2)
    lws = {"$(LWS_GROUP_SIZE)": str(g.nodes), "$(LWS_WORKER_INDEX)": "0", "$(LWS_LEADER_ADDRESS)": "127.0.0.1"}
    filled = list(argv)
    for key, value in lws.items():
        filled = [a.replace(key, value) for a in filled]
    check_rendered_argv(bp.plan, prof, filled)
    env = {**flags.server_env(bp.plan, prof), **flags.multinode_env("eth0"),
           "NO_PROXY": "localhost,127.0.0.1,0.0.0.0,::1"}
    env_list = [{"name": key, "value": v} for key, v in sorted(env.items())]

    def template(leader: bool) -> dict:
        resources, security, volumes, mounts = _pod_common(loaded, bp, prof)
        c = {"name": "sglang", "image": prof.container.image, "command": ["python3", "-m", "sglang.launch_server"],
             "args": list(argv), "env": env_list, "resources": resources, "securityContext": security,
             "volumeMounts": mounts}
        if leader:
            c["ports"] = [{"name": "http", "containerPort": port}]
            c.update(_probes(port, prof.container.ready_timeout_s))
        labels = _labels(fleet.name, g.name, **({"io.escha/serve": "true"} if leader else {}))
        return {"metadata": {"labels": labels, "annotations": {"io.escha/memlock": MEMLOCK_ASSUMPTION}},
                "spec": _pod_spec(loaded, [c], volumes)}

    lws = {"apiVersion": LWS_API, "kind": "LeaderWorkerSet",
           "metadata": {"name": name, "namespace": k.namespace, "labels": _labels(fleet.name, g.name)},
           "spec": {"replicas": n_instances, "startupPolicy": "LeaderCreated",
                    "leaderWorkerTemplate": {"size": g.nodes, "restartPolicy": "RecreateGroupOnPodRestart",
                                             "leaderTemplate": template(True), "workerTemplate": template(False)}}}
    service = {"apiVersion": "v1", "kind": "Service",
               "metadata": {"name": f"{name}-leader", "namespace": k.namespace, "labels": _labels(fleet.name, g.name)},
               "spec": {"selector": {"io.escha/fleet": fleet.name, "io.escha/group": g.name, "io.escha/serve": "true"},
                        "ports": [{"name": "http", "port": port, "targetPort": port}]}}
    return [lws, service]


def _router(loaded: LoadedFleet, fp: FleetPlan) -> list[dict]:
    fleet, k = loaded.fleet, loaded.fleet.kubernetes
    r = fleet.router
    ports = {fp.profile(b.name).container.port for b in fleet.boxes}
    if len(ports) > 1:
        raise BadInput(f"{loaded.path}: the boxes' profiles use different container.port values {sorted(ports)}; "
                       "SMG's Kubernetes discovery takes one --service-discovery-port")
    name = f"{fleet.name}-router"
    # in the pod SMG serves and exports metrics on every address: the Service and probes reach it there
    discovery = ServiceDiscovery(selector=(f"io.escha/fleet={fleet.name}", "io.escha/serve=true"),
                                 namespace=k.namespace, port=ports.pop())
    args = router_args(loaded, fp, bind_host="0.0.0.0", prometheus_host="0.0.0.0", discovery=discovery)
    key_name = CONTAINER_KEY_PATH.rsplit("/", 1)[-1]
    labels = _labels(fleet.name, "router", **{"app.kubernetes.io/component": "router"})
    container = {
        "name": "smg", "image": r.image, "command": launch_command(args, CONTAINER_KEY_PATH, launcher=ROUTER_LAUNCHER),
        "ports": [{"name": "http", "containerPort": r.port}, {"name": "metrics", "containerPort": r.metrics_port}],
        "readinessProbe": {"httpGet": {"path": "/readiness", "port": r.port}, "periodSeconds": 10},
        "livenessProbe": {"httpGet": {"path": "/liveness", "port": r.port}, "periodSeconds": 30},
        "volumeMounts": [{"name": "key", "mountPath": "/run/secrets", "readOnly": True}],
        "securityContext": {"capabilities": {"drop": ["ALL"]}, "allowPrivilegeEscalation": False,
                            "readOnlyRootFilesystem": True},
        "resources": {"requests": {"cpu": "500m", "memory": "512Mi"}, "limits": {"memory": "2Gi"}},
    }
    volumes = [{"name": "key", "secret": {"secretName": k.api_key_secret,
                                          "items": [{"key": "api-key", "path": key_name}]}}]
    spec = {"containers": [container], "volumes": volumes, "serviceAccountName": name}
    meta = {"name": name, "namespace": k.namespace, "labels": labels}
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": meta,
         "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": meta,
         "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": k.namespace}],
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name}},
        {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta,
         "spec": {"replicas": 1, "selector": {"matchLabels": {"io.escha/fleet": fleet.name,
                                                               "io.escha/group": "router"}},
                  "template": {"metadata": {"labels": labels}, "spec": spec}}},
        {"apiVersion": "v1", "kind": "Service", "metadata": meta,
         "spec": {"selector": {"io.escha/fleet": fleet.name, "io.escha/group": "router"},
                  "ports": [{"name": "http", "port": r.port, "targetPort": r.port}]}},
    ]


def render_k8s(loaded: LoadedFleet, fp: FleetPlan) -> list[dict]:
    """Every object, in apply order: per group its workload and Service (and ConfigMap), then
    the router's objects when the fleet has a router."""
    out: list[dict] = []
    for g in loaded.fleet.effective_groups():
        n = len(g.boxes) // g.nodes
        out += _multi_node(loaded, fp, g, n) if g.nodes > 1 else _single_node(loaded, fp, g, n)
    if loaded.fleet.router is not None:
        out += _router(loaded, fp)
    _check_names(loaded, out)
    return out


#: A Service name is a DNS-1035 label (kubernetes.io/docs/concepts/services-networking/service:
#: "The name of a Service object must be a valid RFC 1035 label name"): at most 63 lowercase
#: letters, digits and '-', starting with a letter. The other objects share their Service's
#: name (fleet-group) or add a suffix to it, and a pod's hostname is its StatefulSet's name
#: and ordinal (a DNS-1123 label, 63 at most): every name is held to the Service rule.
_RFC1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")


def _check_names(loaded: LoadedFleet, objs: list[dict]) -> None:
    """Refuse (``BadInput``, one line per name) an object name Kubernetes would reject, before
    anything is written: too long (a 40-character fleet name and a 40-character group name
    make 81) or starting with a digit."""
    bad = []
    for o in objs:
        name = o["metadata"]["name"]
        if not _RFC1035_LABEL.match(name) and name not in bad:
            bad.append(name)
    if bad:
        n = min(bad, key=len)  # the Service's own name; the others add a suffix to it
        more = f" (and {len(bad) - 1} more made from it)" if len(bad) > 1 else ""
        raise BadInput(f"{loaded.path}: kubernetes: the object name {n!r} ({len(n)} characters){more} is not an "
                       "RFC 1035 label (at most 63 lowercase letters, digits and '-', starting with a letter), as "
                       "Kubernetes requires of a Service: shorten or rename the fleet or the group it is made of")


def dump(objs: list[dict], loaded: LoadedFleet) -> str:
    import yaml

    head = (f"# Rendered by `escha-deploy fleet render k8s {loaded.path}`; do not edit by hand.\n"
            f"# Needs: the LeaderWorkerSet controller (kubernetes-sigs/lws) for multi-node groups, the NVIDIA\n"
            f"# device plugin (nvidia.com/gpu), Secret {loaded.fleet.kubernetes.api_key_secret} (key api-key).\n"
            f"# Memlock: {MEMLOCK_ASSUMPTION}.\n")
    return head + yaml.safe_dump_all(objs, sort_keys=False, width=100)
