"""``fleet render k8s``: core objects pass ``kubernetes-validate`` (strict, Kubernetes 1.37.0),
the LeaderWorkerSet passes the LWS CRD's own schema (vendored from kubernetes-sigs/lws v0.10.0,
tests/fleet/vendor/README.md), and the numbers come from the plan."""

from __future__ import annotations

import copy
import importlib.util
from pathlib import Path

import pytest

# the `test` extra's validators; a machine with only the package, pytest and torch (the GPU
# machine's `pytest -m gpu`) skips this module instead of stopping collection
jsonschema = pytest.importorskip("jsonschema")
kubernetes_validate = pytest.importorskip("kubernetes_validate")
import yaml

from escha_deploy.cli.main import main
from escha_deploy.fleet.k8s import render_k8s
from escha_deploy.fleet.model import load_fleet
from escha_deploy.fleet.plan import plan_fleet

K8S_VERSION = "1.37.0"  # pinned: kubernetes-validate 1.37.0 ships this version's schemas
CRD = Path(__file__).parent / "vendor" / "leaderworkerset.x-k8s.io_leaderworkersets.yaml"
PROFILE = "rtx5060ti-tp2-fp8"


@pytest.fixture(scope="module")
def lws_schema() -> dict:
    crd = yaml.load(CRD.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    return next(v for v in crd["spec"]["versions"] if v["name"] == "v1")["schema"]["openAPIV3Schema"]


def unknown_fields(obj, schema: dict, path: str = "") -> list[str]:
    """Keys the schema does not declare (a structural CRD schema prunes them silently; `kubectl
    apply --validate=strict` refuses them): a typo must fail the test."""
    out = []
    if isinstance(obj, dict):
        props = schema.get("properties")
        extra = schema.get("additionalProperties")
        if props is None and not isinstance(extra, dict):
            return out  # free-form (x-kubernetes-preserve-unknown-fields or a map of anything)
        for k, v in obj.items():
            if props is not None and k in props:
                out += unknown_fields(v, props[k], f"{path}.{k}")
            elif isinstance(extra, dict):
                out += unknown_fields(v, extra, f"{path}.{k}")
            else:
                out.append(f"{path}.{k}")
    elif isinstance(obj, list) and isinstance(schema.get("items"), dict):
        for i, v in enumerate(obj):
            out += unknown_fields(v, schema["items"], f"{path}[{i}]")
    return out


def check_lws(obj: dict, schema: dict) -> list[str]:
    errors = [f"{'.'.join(map(str, e.path))}: {e.message}"
              for e in jsonschema.Draft7Validator(schema).iter_errors(obj)]
    return errors + [f"{p}: unknown field" for p in unknown_fields(obj, schema)]


def fleet_file(tmp: Path, l3: bool = False) -> Path:
    (tmp / "router.key").write_text("k\n")
    # one loopback address per box: Kubernetes takes one container.port for every box (SMG's
    # --service-discovery-port), so boxes that serve HTTP need their own addresses. r2 and l3a are
    # the replicas on other machines that compose could not reach: not loopback (the router's own
    # machine, fleet.plan._reachability_problems) but RFC 5737's documentation range, which
    # nothing here connects to (plan and render only)
    boxes = [
        {"name": "r1", "address": "127.0.0.1", "profile": PROFILE, "host_ram": "64GiB"},
        {"name": "r2", "address": "192.0.2.2", "profile": PROFILE, "host_ram": "16GiB", "platform": "wsl2"},
        {"name": "n0", "address": "127.0.0.2", "profile": PROFILE, "host_ram": "64GiB"},
        {"name": "n1", "address": "127.0.0.3", "profile": PROFILE, "host_ram": "64GiB"},
        {"name": "n2", "address": "127.0.0.4", "profile": PROFILE, "host_ram": "64GiB"},
        {"name": "n3", "address": "127.0.0.5", "profile": PROFILE, "host_ram": "64GiB"},
    ]
    groups = [{"name": "chat", "boxes": ["r1", "r2"]}, {"name": "big", "nodes": 2, "boxes": ["n0", "n1", "n2", "n3"]}]
    if l3:
        boxes.append({"name": "l3a", "address": "192.0.2.20", "profile": "linux-tp2-l3", "host_ram": "128GiB"})
        groups.append({"name": "longctx", "boxes": ["l3a"]})
    doc = {"name": "lab", "boxes": boxes, "groups": groups,
           "router": {"box": "r1", "api_key_file": "router.key"},
           "kubernetes": {"namespace": "llm", "runtime_class": "nvidia", "hf_token_secret": "hf"}}
    path = tmp / "fleet.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def rendered(tmp: Path, l3: bool = False):
    loaded = load_fleet(fleet_file(tmp, l3))
    fp = plan_fleet(loaded)
    # the replicas off the router's box are not exposed: compose and fleet up could not reach
    # them, Kubernetes can (render_k8s checks `problems` only)
    assert fp.problems == [], fp.problems
    assert [p.split(":")[0] for p in fp.docker_problems] == ["box r2"] + (["box l3a"] if l3 else [])
    return loaded, fp, render_k8s(loaded, fp)


def test_every_object_validates(tmp_path, lws_schema):
    _, _, objs = rendered(tmp_path, l3=True)
    kinds = [o["kind"] for o in objs]
    assert kinds.count("LeaderWorkerSet") == 1 and "StatefulSet" in kinds and "Deployment" in kinds
    assert {"ServiceAccount", "Role", "RoleBinding", "ConfigMap", "Service"} <= set(kinds)
    for o in objs:
        if o["kind"] == "LeaderWorkerSet":
            assert check_lws(o, lws_schema) == []
        else:
            kubernetes_validate.validate(o, K8S_VERSION, strict=True)


def test_the_checks_can_fail(tmp_path, lws_schema):
    _, _, objs = rendered(tmp_path)
    lws = copy.deepcopy(next(o for o in objs if o["kind"] == "LeaderWorkerSet"))
    lws["spec"]["leaderWorkerTemplate"]["size"] = "two"
    lws["spec"]["leaderWorkerTemplate"]["restartPolicy"] = "Sometimes"
    lws["spec"]["leaderWorkerTemplate"]["sise"] = 2
    errors = check_lws(lws, lws_schema)
    assert any("size" in e for e in errors) and any("Sometimes" in e for e in errors)
    assert any("sise: unknown field" in e for e in errors)
    dep = copy.deepcopy(next(o for o in objs if o["kind"] == "Deployment"))
    dep["spec"]["template"]["spec"]["containers"][0]["resourcez"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(dep, K8S_VERSION, strict=True)


def test_lws_shape(tmp_path):
    _, fp, objs = rendered(tmp_path)
    lws = next(o for o in objs if o["kind"] == "LeaderWorkerSet")
    spec = lws["spec"]
    assert spec["replicas"] == 2  # n0+n1 and n2+n3
    lwt = spec["leaderWorkerTemplate"]
    assert lwt["size"] == 2 and lwt["restartPolicy"] == "RecreateGroupOnPodRestart"
    leader, worker = (lwt[k]["spec"]["containers"][0] for k in ("leaderTemplate", "workerTemplate"))
    for c in (leader, worker):
        a = c["args"]
        assert a[a.index("--dist-init-addr") + 1] == "$(LWS_LEADER_ADDRESS):20000"
        assert a[a.index("--nnodes") + 1] == "$(LWS_GROUP_SIZE)" and a[a.index("--node-rank") + 1] == "$(LWS_WORKER_INDEX)"
        assert a[a.index("--pp-size") + 1] == "2" and a[a.index("--tp-size") + 1] == "2"
        assert c["resources"]["limits"]["nvidia.com/gpu"] == "2"
    assert "startupProbe" in leader and "startupProbe" not in worker and "ports" not in worker
    assert lwt["leaderTemplate"]["metadata"]["labels"]["io.escha/serve"] == "true"
    assert "io.escha/serve" not in lwt["workerTemplate"]["metadata"]["labels"]
    assert lwt["leaderTemplate"]["spec"]["runtimeClassName"] == "nvidia"
    assert any(o["kind"] == "Service" and o["metadata"]["name"] == "lab-big-leader" for o in objs)


def test_memory_probe_and_shm_come_from_the_plan(tmp_path):
    _, fp, objs = rendered(tmp_path)
    dep = next(o for o in objs if o["kind"] == "Deployment" and o["metadata"]["name"] == "lab-chat")
    pod = dep["spec"]["template"]
    c = pod["spec"]["containers"][0]
    # the group runs its smaller box's plan (r2: 16 GiB WSL2)
    p = fp.box_plan("r2").plan
    b = p.budget
    want = p.pinned_total_bytes + b.server_processes_bytes + b.os_reserve_bytes + b.page_cache_floor_bytes + 2 * 2**30
    assert c["resources"]["limits"]["memory"] == c["resources"]["requests"]["memory"] == f"{-(-want // 2**20)}Mi"
    sp = c["startupProbe"]
    assert sp["periodSeconds"] * sp["failureThreshold"] >= fp.profile("r2").container.ready_timeout_s
    shm = next(v for v in pod["spec"]["volumes"] if v["name"] == "dshm")
    assert shm["emptyDir"]["medium"] == "Memory"
    assert "LimitMEMLOCK=infinity" in pod["metadata"]["annotations"]["io.escha/memlock"]
    assert c["securityContext"]["capabilities"]["add"] == ["IPC_LOCK"]
    # secrets by reference only
    sources = next(v for v in pod["spec"]["volumes"] if v["name"] == "secrets")["projected"]["sources"]
    assert [s["secret"]["name"] for s in sources] == ["escha-api-key", "hf"]


def test_router_discovers_pods_with_the_rbac_it_needs(tmp_path):
    loaded, fp, objs = rendered(tmp_path)
    role = next(o for o in objs if o["kind"] == "Role")
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]
    dep = next(o for o in objs if o["kind"] == "Deployment" and o["metadata"]["name"] == "lab-router")
    cmd = dep["spec"]["template"]["spec"]["containers"][0]["command"]
    args = cmd[cmd.index("--") + 1:]
    assert "--worker-urls" not in args and "--service-discovery" in args
    assert args[args.index("--selector") + 1:args.index("--selector") + 3] == ["io.escha/fleet=lab", "io.escha/serve=true"]
    if importlib.util.find_spec("smg") is not None:
        from smg.launch_router import parse_router_args

        parsed = parse_router_args(args)
        assert parsed.service_discovery and parsed.service_discovery_namespace == "llm"
        assert parsed.service_discovery_port == 30000


def test_cli_writes_the_file(tmp_path, capsys):
    path = fleet_file(tmp_path)
    try:
        main(["fleet", "render", "k8s", str(path), "--out", str(tmp_path / "k8s")])
    except SystemExit as exc:
        assert exc.code in (0, None)
    text = (tmp_path / "k8s" / "fleet.k8s.yaml").read_text()
    assert text.startswith("# Rendered by `escha-deploy fleet render k8s")
    assert len(list(yaml.safe_load_all(text))) == len(render_k8s(load_fleet(path), plan_fleet(load_fleet(path))))


def test_every_serving_pod_listens_where_the_router_discovers_it(tmp_path):
    """The compose problem of a worker published on 127.0.0.1 has no Kubernetes form: SMG
    connects to each discovered pod's IP at --service-discovery-port, so each serving pod's
    SGLang must bind 0.0.0.0 on that port. The single-node pod runs `serve` in container mode
    (ESCHA_SERVE_MODE=container) with the ConfigMap's profile and the pod's --set items: its
    argv comes from the same build_launch_spec; the LWS leader's argv is in the manifest."""
    from escha_deploy.pipeline.spec import build_launch_spec
    from escha_deploy.profile import load_profile

    loaded, fp, objs = rendered(tmp_path)
    router = next(o for o in objs if o["kind"] == "Deployment" and o["metadata"]["name"] == "lab-router")
    rargs = router["spec"]["template"]["spec"]["containers"][0]["command"]
    port = rargs[rargs.index("--service-discovery-port") + 1]
    dep = next(o for o in objs if o["kind"] == "Deployment" and o["metadata"]["name"] == "lab-chat")
    c = dep["spec"]["template"]["spec"]["containers"][0]
    assert {"name": "ESCHA_SERVE_MODE", "value": "container"} in c["env"]
    cm = next(o for o in objs if o["kind"] == "ConfigMap" and o["metadata"]["name"] == "lab-chat-profile")
    (tmp_path / "pod-profile.yaml").write_text(cm["data"]["profile.yaml"])
    sets = [a for i, a in enumerate(c["args"]) if i and c["args"][i - 1] == "--set"]
    prof = load_profile(str(tmp_path / "pod-profile.yaml"), sets)
    argv = build_launch_spec(fp.box_plan("r1").plan, prof, native=False).argv
    assert (argv[argv.index("--host") + 1], argv[argv.index("--port") + 1]) == ("0.0.0.0", port)
    assert c["ports"][0]["containerPort"] == int(port)
    lws = next(o for o in objs if o["kind"] == "LeaderWorkerSet")
    leader = lws["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]["containers"][0]["args"]
    assert (leader[leader.index("--host") + 1], leader[leader.index("--port") + 1]) == ("0.0.0.0", port)


def test_the_l3_volume_is_the_plans_disk_need_and_a_store_without_a_cap_is_refused(tmp_path):
    """SGLang's file L3 cap holds per rank (each rank's LRUFileEvictor, lru_file_evictor.py):
    linux-tp2-l3's 512 GB at TP2 is a 1,024 GB volume, never a silent default."""
    from escha_deploy.utils.errors import BadInput

    _, fp, objs = rendered(tmp_path, l3=True)
    sts = next(o for o in objs if o["kind"] == "StatefulSet")
    [claim] = sts["spec"]["volumeClaimTemplates"]
    need = fp.box_plan("l3a").plan.l3_disk.need_bytes
    assert need == 2 * 512 * 10**9
    assert claim["spec"]["resources"]["requests"]["storage"] == f"{-(-need // 2**20)}Mi"
    (tmp_path / "nocap.yaml").write_text("extends: linux-tp2-l3\nname: nocap\nhicache:\n  l3:\n    kind: file\n"
                                         "    dir: /var/lib/escha/hicache\n    max_size: null\n")
    doc = yaml.safe_load((tmp_path / "fleet.yaml").read_text())
    next(b for b in doc["boxes"] if b["name"] == "l3a")["profile"] = str(tmp_path / "nocap.yaml")
    (tmp_path / "fleet.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    loaded = load_fleet(tmp_path / "fleet.yaml")
    with pytest.raises(BadInput, match=r"^hicache.l3.max_size: group longctx's profile nocap has a file L3 store "
                                       r"without a cap"):
        render_k8s(loaded, plan_fleet(loaded))


def test_a_hugging_face_snapshot_mounts_its_blobs_in_the_pod(tmp_path):
    """As the container does (launch_spec.container_spec): the snapshot at model.path and its
    repository's blobs/ where the snapshot's ../../blobs links point from there."""
    from tests.hf_layout import hf_cache, snapshot

    root = hf_cache(tmp_path / "hub")
    path = fleet_file(tmp_path)
    doc = yaml.safe_load(path.read_text())
    for b in doc["boxes"]:
        b["set"] = [f"model.host_dir={snapshot(root)}"]
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    loaded = load_fleet(path)
    objs = render_k8s(loaded, plan_fleet(loaded))
    pod = next(o for o in objs if o["kind"] == "LeaderWorkerSet")["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]
    assert {"name": "model-blobs", "hostPath": {"path": str(root / "blobs"), "type": "Directory"}} in pod["volumes"]
    mounts = pod["containers"][0]["volumeMounts"]
    assert {"name": "model-blobs", "mountPath": "/blobs", "readOnly": True} in mounts
    assert {"name": "model", "mountPath": "/models/Qwen3.x-27B-GPTQ-Int4", "readOnly": True} in mounts
