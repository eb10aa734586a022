"""One model instance spanning nodes, with SGLang's own multi-node launch.

Every node runs the same server command with ``--nnodes N --node-rank R --dist-init-addr
RANK0:PORT`` (SGLang ``docs/references/multi_node_deployment/multi_node.md``), host networking
(NCCL and Gloo open connections between nodes on ports they choose), and the socket-transport
environment (``flags.multinode_env``). Rank 0 runs the tokenizer and the HTTP API; ranks >= 1
run schedulers only and answer ``/health`` with 200 whatever the model's state
(``entrypoints/engine.py``: ``node_rank >= 1`` starts ``launch_dummy_health_check_server``,
``utils/common.py``), so they get no published API and no model health check.

Across nodes: ``pp`` (default) keeps TP inside a node and puts pipeline stages on nodes, so
cross-node traffic is one activation per stage boundary (SGLang
``docs/advanced_features/pipeline_parallelism.md``); ``tp`` makes one TP group of every GPU.
SGLang 0.5.19 supports PP with a hybrid GDN model and HiCache by its source: the mamba pool is
sized per stage (``mem_cache/kv_cache_configurator.py`` ``_handle_max_mamba_cache``), the
unified radix cache syncs HiCache events across PP ranks (``mem_cache/unified_radix_cache.py``)
and no validation refuses the pair; it is not tested here on GPUs.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from ..utils.netaddr import host_port
from ..planner.result import Plan
from ..profile.rules import extra_arg, speculative_algorithm
from ..profile import Profile
from .model import Instance


def _extra(profile: Profile, flag: str) -> str | None:
    """``profile.rules.extra_arg`` over the profile's ``runtime.extra_args``."""
    return extra_arg(profile.runtime.extra_args, flag)


def instance_problems(inst: Instance, plans: list[Plan], profiles: list[Profile]) -> list[str]:
    """Why SGLang 0.5.19 would refuse this multi-node instance, or it cannot work, one line each.

    SGLang's own refusals (``arg_groups/validation_hook.py`` ``check_server_args``): data
    parallel across nodes without DP attention ("multi-node data parallel is not supported
    unless dp attention"); ``pp_size > 1`` with speculative decoding; ``tp_size x pp_size`` not
    divisible by ``nnodes``. What cannot work: nodes with different GPU counts, models or
    images (every node loads its share of one model from the same command line).
    """
    out: list[str] = []
    name = inst.name
    tps = {p.tp_size for p in plans}
    if len(tps) > 1:
        out.append(f"{name}: nodes use different GPU counts (tp_size {sorted(tps)}); SGLang splits the instance "
                   "evenly over nodes (tp_size x pp_size divisible by nnodes)")
    paths = {p.model.path for p in profiles}
    if len(paths) > 1:
        out.append(f"{name}: nodes serve different models ({', '.join(sorted(paths))})")
    for prof in profiles:
        dp = _extra(prof, "--dp-size") or _extra(prof, "--data-parallel-size") or _extra(prof, "--dp")
        if dp and dp != "1" and not _extra(prof, "--enable-dp-attention"):
            out.append(f"{name}: runtime.extra_args sets --dp-size {dp} without --enable-dp-attention: SGLang "
                       "refuses multi-node data parallel without DP attention; use replicas behind the router")
        spec = speculative_algorithm(prof)
        if spec and inst.group.parallel == "pp":
            out.append(f"{name}: runtime.speculative.algorithm is {spec}: SGLang refuses pipeline "
                       "parallelism with speculative decoding; set parallel: tp on the group")
        if _extra(prof, "--nnodes") or _extra(prof, "--node-rank") or _extra(prof, "--dist-init-addr"):
            out.append(f"{name}: runtime.extra_args sets a multi-node flag; the fleet renders those")
    return out


def instance_warnings(inst: Instance, nics: list[str | None], where: list[str]) -> list[str]:
    """What may hang a multi-node instance without being wrong, one line each: a node without
    ``nic``. Without ``NCCL_SOCKET_IFNAME`` NCCL picks an interface itself (any but ``lo`` and
    ``docker*``: a VPN, a bridge or one of WSL2's mirrored adapters may be first) and Gloo takes
    the one its host name resolves to, so peers may try an address they cannot reach and the
    start stalls at "Init nccl begin" (sglang#958). ``where[i]``: ``FILE:LINE`` of node i's box
    in the fleet file."""
    return [f"{where[rank]}: boxes.{box}.nic: unset on node {rank} of {inst.name}: NCCL and Gloo pick an "
            "interface themselves (a VPN, a bridge or another adapter the other nodes cannot reach) and the start "
            "can hang at 'Init nccl begin' (sglang#958); set nic to the interface the nodes reach each other on "
            "(rendered as NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME)"
            for rank, (box, nic) in enumerate(zip(inst.boxes, nics)) if not nic]


class NodeLaunch(BaseModel):
    """One node's server: its argv (after ``python3 -m sglang.launch_server``), environment,
    and whether it serves the API (rank 0 only)."""

    instance: str
    box: str
    node_rank: int
    nnodes: int
    tp_size: int = Field(description="--tp-size (the instance's total)")
    pp_size: int
    dist_init_addr: str
    port: int = Field(description="the port rank 0 serves the API on (--port)")
    argv: list[str]
    env: dict[str, str]
    serves_api: bool
    network_mode: str = "host"


def render_nodes(inst: Instance, plans: list[Plan], profiles: list[Profile], addresses: list[str],
                 nics: list[str | None], *, rank0_binds_address: bool = False) -> list[NodeLaunch]:
    """Per-node launches of ``inst``, all from the plan with the smallest host pools (a node
    that could pin more runs safely with less; pinned bytes grow with the ratio), so every node
    passes the same flags but ``--node-rank``. ``addresses[0]`` is rank 0's.
    ``rank0_binds_address``: rank 0 listens on ``addresses[0]`` (host networking, where the router
    reaches it) instead of 0.0.0.0. Each node's argv is checked against the planned release's
    flag catalog (``pipeline.check_rendered_argv``: ``BadArgv``, exit 2)."""
    from ..pipeline import argv as flags
    from ..pipeline import check_rendered_argv

    i_min = min(range(len(plans)), key=lambda i: (plans[i].per_rank.pinned_bytes, i))
    base_plan, base_prof = plans[i_min], profiles[i_min]
    n = len(inst.boxes)
    local = base_prof.runtime.tp_size
    tp, pp = (local, n) if inst.group.parallel == "pp" else (local * n, 1)
    addr = host_port(addresses[0], inst.group.dist_init_port)  # [v6]:port (SGLang's NetworkAddress.parse)
    out = []
    for rank, box in enumerate(inst.boxes):
        node = flags.MultiNode(nnodes=n, node_rank=rank, dist_init_addr=addr, tp_size=tp, pp_size=pp,
                               dist_timeout_s=inst.group.dist_timeout_s)
        bind = addresses[0] if rank == 0 and rank0_binds_address else "0.0.0.0"
        argv = flags.server_args(base_plan, base_prof, host=bind, multinode=node)
        # the argv this node runs, checked against the release's flag catalog (BadArgv, exit 2)
        check_rendered_argv(base_plan, base_prof, argv)
        env = {**flags.server_env(base_plan, base_prof), **flags.multinode_env(nics[rank])}
        out.append(NodeLaunch(instance=inst.name, box=box, node_rank=rank, nnodes=n, tp_size=tp, pp_size=pp,
                              dist_init_addr=addr, port=base_prof.container.port, argv=argv, env=env,
                              serves_api=rank == 0))
    return out
