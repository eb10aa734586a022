"""Render: a plan's ``LaunchSpec`` (``spec.build_launch_spec``) with the fact values it assumed
(``launch_facts``), and a compose file's container half with no plan (``render_container``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from escha_deploy.facts.provenance import FactSource

if TYPE_CHECKING:
    from escha_deploy.pipeline.gathering import Gathered
    from escha_deploy.pipeline.spec import ContainerSpec, LaunchFacts, LaunchSpec
    from escha_deploy.planner.result import Plan
    from escha_deploy.profile import Profile


def render_container(profile: Profile, *, overrides: Sequence[str] = (), profile_file: str | None = None,
                     platform: str = "linux") -> ContainerSpec:
    """The container half of ``profile``'s launch with no plan and no host facts
    (``launch_spec.container_spec``): for a compose file, whose container plans for itself
    (``serve --profile``) on the box it runs on. The one fact it takes is the ``platform``
    Docker runs on (default Linux: GPUs by device id; a WSL2 box's file is rendered from its
    facts file, ``compose --facts``); no plan digest label."""
    from escha_deploy.pipeline.spec import container_spec

    return container_spec(profile, platform=platform, overrides=overrides, profile_file=profile_file)


def render(plan: Plan, profile: Profile, g: Gathered, *, overrides: Sequence[str] = (), native: bool = False,
           profile_file: str | None = None, sources: Sequence[FactSource] = (), spec_file: str | None = None,
           facts_file: str | None = None) -> LaunchSpec:
    """The ``LaunchSpec`` of ``plan`` (``launch_spec.build_launch_spec``, pure) with the fact
    values it assumed (``launch_facts``): the digest ``up`` labels the container with, ``serve
    --print`` shows and ``plan --format json`` carries for the same facts. ``sources``: where
    each fact came from (``up --dry-run`` lists them; not in the digest). The other keywords are
    ``build_launch_spec``'s."""
    from escha_deploy.pipeline.spec import build_launch_spec

    return build_launch_spec(plan, profile, overrides=list(overrides), native=native, profile_file=profile_file,
                             facts=launch_facts(plan, g), sources=sources, spec_file=spec_file,
                             facts_file=facts_file)


def launch_facts(plan: Plan, g: Gathered) -> LaunchFacts:
    """The fact values ``plan`` assumed, as the digest covers them (no sources, no times,
    no readings of a moment such as MemAvailable)."""
    from escha_deploy.pipeline.spec import LaunchFacts

    h = g.host
    md = g.model_dir
    return LaunchFacts(
        platform=h.platform, mem_total_bytes=h.mem_total_bytes, hugetlb_bytes=h.hugetlb_bytes,
        cgroup_limit_bytes=h.cgroup_limit_bytes, memory_base_bytes=h.memory_base_bytes,
        pinned_ceiling_bytes=h.pinned_ceiling_bytes, pinned_ceiling_reached=h.pinned_ceiling_reached,
        host_allocator=h.host_allocator, capabilities=sorted(plan.capabilities), gpus=list(g.gpus),
        model_safetensors_bytes=md.safetensors_bytes if md else None,
        model_arch=md.arch.model_dump(mode="json") if md and md.arch else None,
        sglang_release=plan.sglang_release,
        draft_weights_bytes=g.draft.weights_bytes if g.draft else None,
        draft_num_layers=g.draft.num_layers if g.draft else None,
    )
