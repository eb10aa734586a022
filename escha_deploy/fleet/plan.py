"""``fleet plan``: every box planned with its own facts by the single-box planner, plus the
checks that only a fleet has (a WSL2 box in NAT mode cannot be a multi-node peer; all nodes of
one instance run the same image digest).

Per box this runs the pipeline ``escha-deploy plan`` runs (``profile.load_profile``,
``pipeline.plan_request`` (a ``FactsFileHost`` or ``DescribedHost``, ``BoxRuntime(here=False)``): the plan, the argv check
and the launch's digest); the only difference is where the host facts come from: a saved doctor
report or facts file of that box (read once, by ``gather``, as ``plan --facts`` reads it, source
``facts``; its ``runtime`` section is the box's runtime, as there) or the box's
``host_ram``/``platform`` (source ``described``, as ``plan --host-ram``). A multi-node instance is planned per node with the node's own profile:
its TP ranks are the box's GPUs, so weights and KV per rank are counted at the node's
``tp_size`` (with TP across nodes the real per-rank shares are smaller: the plan errs on the
safe side).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal, NamedTuple

from pydantic import BaseModel, Field, PrivateAttr

from ..utils.errors import BadInput, Refused
from ..facts.file import FactsFile
from ..pipeline.spec import LaunchSpec
from ..utils.netaddr import parse_host
from ..planner.result import Plan
from ..profile import Profile
from .model import Box, LoadedFleet


#: How a box's facts file is named in its reader's messages (``factsfile.load_facts_file``,
#: through ``pipeline.gather``), and how to make a good one.
BOX_FACTS_WHAT = "the box's saved facts"
BOX_FACTS_HINT = "save them with `escha-deploy doctor --format json > FILE`"


class BoxPlan(BaseModel):
    """One box's plan, as ``escha-deploy plan`` makes it, and its place in the fleet."""

    box: str
    address: str
    profile: str
    group: str | None
    instance: str | None
    node_rank: int | None
    gpus: int = Field(description="GPUs the server uses (the profile's tp_size)")
    facts_file: str | None = Field(default=None, description="the box's saved facts (a doctor report or a facts file)")
    facts: FactsFile | None = Field(default=None, description="what they say (factsfile.load_facts_file, "
                                    "as pipeline.gather read them)")
    verdict: str
    hicache_ratio: float | None
    hicache_size_gb: int | None
    pinned_total_bytes: int
    host_kv_tokens: int = Field(description="host-tier tokens per rank (0: HiCache off)")
    reasons: list[str]
    plan: Plan


class InstancePlan(BaseModel):
    name: str
    group: str
    boxes: list[str]
    nodes: int
    gpus: int
    host_tier_tokens: int = Field(description="host-tier tokens of the instance (its smallest node's)")
    problems: list[str]


class FleetPlan(BaseModel):
    """The fleet's plan: per box, per instance, and totals. ``verdict`` is ``unsafe`` when any
    box is unsafe, any fleet check refuses (``problems``) or the router cannot reach a worker as
    compose and ``fleet up`` run it (``docker_problems``; ``fleet render k8s`` checks
    ``problems`` only): exit 3."""

    fleet: str
    file: str
    boxes: list[BoxPlan]
    instances: list[InstancePlan]
    total_instances: int
    total_gpus: int
    host_tier_bytes: int = Field(description="pinned host pools over every box (bytes)")
    host_tier_tokens: int = Field(description="host-tier tokens over every instance")
    problems: list[str]
    warnings: list[str]
    verdict: Literal["ok", "unsafe"]
    docker_problems: list[str] = Field(default_factory=list, description="what refuses compose and fleet up "
                                       "(published ports), not Kubernetes")
    _profiles: dict[str, Profile] = PrivateAttr(default_factory=dict)
    _launches: dict[str, LaunchSpec] = PrivateAttr(default_factory=dict)

    def profile(self, box: str) -> Profile:
        """The validated profile (with the box's overrides) that box ``box`` was planned with."""
        return self._profiles[box]

    def launch(self, box: str) -> LaunchSpec:
        """The launch spec box ``box``'s plan rendered (``pipeline.plan_request`` with its
        ``set`` items as the container's overrides): the argv its plan checked, the digest its
        plan carries, the container ``fleet compose`` writes."""
        return self._launches[box]

    def box_plan(self, box: str) -> BoxPlan:
        return next(b for b in self.boxes if b.box == box)


class PlannedBox(NamedTuple):
    """One box planned (``plan_box``): its plan, its facts file as read (``None`` for a box the
    fleet file describes), its profile, its runtime problems (lines naming the box) and its
    launch spec."""

    plan: Plan
    facts: FactsFile | None
    profile: Profile
    problems: list[str]
    launch: LaunchSpec


def plan_box(loaded: LoadedFleet, box: Box) -> PlannedBox:
    """Plan one box as ``escha-deploy plan`` would on it (``PlannedBox``); the launch spec is the one request's (the container's
    argv, checked against the release's flags, its digest the plan's), rendered with the box's
    ``set`` items as the container's overrides; the problems are the lines ``plan --facts`` refuses (exit 3) when the
    facts file's runtime lacks a capability the profile needs (``pipeline.Runtime.lacking``),
    each naming the box. Raises ``BadInput`` for a bad profile or facts file and ``Refused`` for
    a release the facts file's runtime contradicts, naming the box."""
    from ..pipeline import (BoxRuntime, DescribedHost, FactsFileHost, LaunchOptions, Options, plan_request,
                            profile_file, secret_path_problems)

    try:
        prof = loaded.profile(box)
        # a key typed where its file's path goes is refused, as `plan` refuses it; a relative
        # path is the fleet file's folder's, where fleet compose copies the key from
        secret_path_problems(prof, base=Path(loaded.path).parent)
        if box.facts:
            # the reader of `plan --facts`, once (host, findings, GPU records and runtime: the GPUs
            # decide peer access, so --disable-custom-all-reduce and NCCL_P2P_DISABLE, as there)
            facts: FactsFileHost | DescribedHost = FactsFileHost(str(loaded.resolve(box.facts)), what=BOX_FACTS_WHAT,
                                                                 hint=BOX_FACTS_HINT)
        else:  # the box as the fleet file describes it (`plan --host-ram`), never $ESCHA_FACTS
            assert box.host_ram is not None
            facts = DescribedHost(box.host_ram, box.platform or "linux", origin=loaded.where(box, "host_ram"))
        # the box's runtime (its facts file's release and capabilities) as `plan --facts` plans
        # it, never this machine's; as `plan --format json` plans: the argv checked, the digest
        # filled; and as the container `fleet compose` writes runs it (the box's `set` items travel
        # to the container's serve, a profile file is mounted)
        launch = LaunchOptions(overrides=tuple(box.set), profile_file=profile_file(loaded.profile_ref(box)))
        req = plan_request(prof, facts, BoxRuntime(here=False), Options(digest=True, launch=launch))
    except (BadInput, Refused) as exc:
        raise type(exc)(*(f"box {box.name}: {p}" for p in exc.problems), hint=exc.hint) from None
    assert req.launch is not None  # Options.launch was given
    return PlannedBox(req.plan, req.gathered.facts_file, prof, [f"box {box.name}: {p}" for p in req.runtime.lacking(prof)],
                   req.launch)


def multinode_member_problems(box: Box, facts: FactsFile | None, instance: str) -> list[str]:
    """Why ``box`` cannot be a node of a multi-node instance, if it cannot.

    A WSL2 VM in NAT mode (WSL's default) has a private address that other machines cannot
    reach (learn.microsoft.com/windows/wsl/networking, "Accessing a WSL 2 distribution from your
    local area network"): NCCL's and Gloo's peers connect to every node, so the rendezvous
    never completes. Mirrored mode is required; without saved facts the mode is unknown.
    """
    platform = facts.host.platform if facts else (box.platform or "linux")
    if platform != "wsl2":
        return []
    mode = facts.host.wsl_networking_mode if facts else None
    if mode == "mirrored":
        return []
    seen = f"networking mode {mode}" if mode else "networking mode unknown (no saved `wslinfo --networking-mode`; NAT is WSL's default)"
    return [f"box {box.name}: a WSL2 node in {instance} needs mirrored networking, {seen}: peer nodes cannot reach "
            "a NAT-mode VM's address, so NCCL/Gloo cannot connect; switch the VM to mirrored networking "
            "(networkingMode=mirrored in .wslconfig), or serve it as a replica behind a router on the same Windows host"]


def _key_or_none(path: Path) -> str | None:
    """The key a key file holds (``launch.prepare.read_secret``'s reading), or None when it
    cannot be read here (a path on another box). Never printed."""
    from ..launch.prepare import read_secret

    try:
        return read_secret(str(path), "api key file")
    except (BadInput, OSError):
        return None


def _reachability_problems(loaded: LoadedFleet, profiles: dict[str, Profile]) -> list[str]:
    """Workers the router cannot reach as ``fleet compose`` and ``fleet up`` run them, one line
    per box. A single-node replica publishes its port on 127.0.0.1 unless its profile sets
    ``container.expose`` (which needs ``container.api_key_file``; ``launch_spec``). The router
    (host networking) reaches a replica on its own box at 127.0.0.1 (``router.worker_url``) and a
    multi-node rank 0 at the address it binds; a replica on another box only when exposed. A
    replica with an API key needs the router to send that key (``router.api_key_file``, the
    same key where both files are readable here).
    Kubernetes is not concerned: a server in a pod binds 0.0.0.0 and SMG finds the pod's IP."""
    fleet = loaded.fleet
    r = fleet.router
    if r is None:
        return []
    out = []
    router_key = _key_or_none(loaded.resolve(r.api_key_file)) if r.api_key_file else None
    for inst in fleet.instances():
        rank0 = inst.boxes[0]
        worker_key_file = profiles[rank0].container.api_key_file
        if not inst.multi_node and worker_key_file:
            # SGLang with --api-key answers 401 on every route but /health and /metrics without
            # that key (srt/utils/auth.py decide_request_auth); SMG sends the router's key to every
            # worker (smg/router_args.py --api-key), or none
            if not r.api_key_file:
                out.append(f"box {rank0}: its server requires the key in container.api_key_file and the router "
                           "sends none (router.api_key_file is unset): SGLang would answer 401 to every request "
                           "SMG forwards; set router.api_key_file to a file with the same key")
            else:
                key = _key_or_none(loaded.resolve(worker_key_file))  # relative: the fleet file's folder
                if key is not None and router_key is not None and key != router_key:
                    out.append(f"box {rank0}: container.api_key_file ({worker_key_file}) holds another key than "
                               f"router.api_key_file ({r.api_key_file}); SMG sends the router's key to every worker, "
                               "so SGLang would answer 401 to every request it forwards: use the same key")
        if inst.multi_node or rank0 == r.box or parse_host(fleet.box(rank0).address).is_loopback:
            continue
        if not profiles[rank0].container.expose:
            out.append(f"box {rank0}: container.expose is false, so compose and fleet up publish its server on "
                       f"127.0.0.1 only and the router on box {r.box} cannot reach it; set container.expose: true "
                       "(with container.api_key_file, the same key as router.api_key_file) in its profile or `set` "
                       "(`fleet render k8s` does not need it)")
    return out


def plan_fleet(loaded: LoadedFleet) -> FleetPlan:
    """Plan every box, then the fleet checks. Pure apart from reading profiles, facts files and
    model folders (as ``plan`` does)."""
    fleet = loaded.fleet
    placement: dict[str, tuple[str, str, int]] = {}
    for inst in fleet.instances():
        for rank, name in enumerate(inst.boxes):
            placement[name] = (inst.group.name, inst.name, rank)
    box_plans: dict[str, BoxPlan] = {}
    profiles: dict[str, Profile] = {}
    launches: dict[str, LaunchSpec] = {}
    runtime_problems: list[str] = []
    for box in fleet.boxes:
        result, facts, profiles[box.name], lacks, launches[box.name] = plan_box(loaded, box)
        runtime_problems += lacks
        group, inst, rank = placement.get(box.name, (None, None, None))
        box_plans[box.name] = BoxPlan(
            box=box.name, address=box.address, profile=result.profile, group=group, instance=inst,
            node_rank=rank, gpus=result.tp_size, facts_file=str(loaded.resolve(box.facts)) if box.facts else None,
            facts=facts, verdict=result.verdict,
            hicache_ratio=result.hicache.ratio if result.hicache.enabled else None,
            hicache_size_gb=result.hicache.size_gb if result.hicache.enabled else None,
            pinned_total_bytes=result.pinned_total_bytes,
            host_kv_tokens=result.per_rank.host_kv_tokens if result.hicache.enabled else 0,
            reasons=list(result.reasons), plan=result)
    problems: list[str] = []
    warnings: list[str] = []
    instances: list[InstancePlan] = []
    for inst in fleet.instances():
        inst_problems: list[str] = []
        if inst.multi_node:
            for name in inst.boxes:
                inst_problems += multinode_member_problems(fleet.box(name), box_plans[name].facts, inst.name)
            from .multinode import instance_problems, instance_warnings

            inst_problems += instance_problems(inst, [box_plans[n].plan for n in inst.boxes],
                                               [profiles[n] for n in inst.boxes])
            warnings += instance_warnings(inst, [fleet.box(n).nic for n in inst.boxes],
                                          [loaded.where(fleet.box(n), "name").rsplit(" ", 1)[0] for n in inst.boxes])
        runtimes = {n: box_plans[n].facts.runtime for n in inst.boxes if box_plans[n].facts is not None}
        digests = {n: r.image_id for n, r in runtimes.items() if r is not None and r.image_id}
        if len(set(digests.values())) > 1:
            listing = ", ".join(f"{n} {d[:19]}" for n, d in digests.items())
            inst_problems.append(f"{inst.name}: nodes run different images ({listing}); one instance needs one "
                                 "image digest on every node (build or load the same image)")
        elif inst.multi_node and len(digests) < len(inst.boxes):
            warnings.append(f"{inst.name}: image digest unknown for "
                            f"{', '.join(n for n in inst.boxes if n not in digests)} (no saved doctor facts); "
                            "every node must run the same image")
        problems += inst_problems
        instances.append(InstancePlan(
            name=inst.name, group=inst.group.name, boxes=list(inst.boxes), nodes=len(inst.boxes),
            gpus=sum(box_plans[n].gpus for n in inst.boxes),
            host_tier_tokens=min(box_plans[n].host_kv_tokens for n in inst.boxes), problems=inst_problems))
    reach = _reachability_problems(loaded, profiles)
    unsafe = [p for p in box_plans.values() if p.verdict == "unsafe"]
    problems += runtime_problems  # a box's runtime lacking a needed capability: `plan --facts` refuses, exit 3
    for p in unsafe:
        problems.append(f"box {p.box}: plan is unsafe: {'; '.join(p.reasons) or 'see escha-deploy plan'}")
    unplaced = [b.name for b in fleet.boxes if b.name not in placement]
    if unplaced:
        warnings.append(f"boxes in no group serve nothing: {', '.join(unplaced)}")
    out = FleetPlan(
        fleet=fleet.name, file=loaded.path, boxes=list(box_plans.values()), instances=instances,
        total_instances=len(instances), total_gpus=sum(i.gpus for i in instances),
        host_tier_bytes=sum(p.pinned_total_bytes for p in box_plans.values() if p.box in placement),
        host_tier_tokens=sum(i.host_tier_tokens for i in instances),
        problems=problems, warnings=warnings, verdict="unsafe" if problems or reach else "ok", docker_problems=reach)
    out._profiles = profiles
    out._launches = launches
    return out
