"""Run ``doctor``: gather the facts, run (or reuse) the probes, build the report, save findings.

Three steps, no logic in the top function: ``gather_facts`` reads the
world, ``run_probes`` runs the slow GPU probes (or reuses saved findings younger than a day, as
``up``'s preflight does), ``build_report`` is pure.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from escha_deploy.facts.saved import DoctorFindings, load_findings, save_findings
from escha_deploy.utils.units import GiB

from .checks import PAGE_CACHE_FLOOR_BYTES, ProfileNeeds, host_checks, profile_checks
from .facts import DoctorFacts, ProbeFacts, gather_facts
from .gpu import GpuInventory, gpu_inventory
from .hostinfo import DockerFacts, read_docker
from .probes import (nccl_attempts, pick_allocator, run_nccl_smoke, run_pinned_ceiling, run_restore_probe,
                     run_store_probe)
from .report import DoctorReport

#: Pinned-ladder target without a profile: 4 GiB, a little over the largest WSL2 ceilings
#: reported in one process (reports in microsoft/WSL#14078: 0.5 GB to about 5 GB).
DEFAULT_PINNED_TARGET_BYTES = 4 * GiB


def needs_from_profile(ref: str, overrides: Sequence[str] = ()) -> ProfileNeeds:
    """Load profile ``ref`` (a name or a path) and plan it against this host through the
    pipeline ``plan`` runs (``pipeline.gather`` -> ``pipeline.decide``: this machine's memory,
    GPUs and model folder, the profile's SGLang release and needs), ignoring saved findings
    (``ThisHost(findings=False)``), ``ESCHA_FACTS`` (doctor measures this machine, not a described
    one) and the secret-file and L3-directory checks (``up``'s, not doctor's). The per-rank
    pinned bytes come from ``plan.per_rank.pinned_bytes``, and an ``unsafe`` verdict's reasons
    become failing ``profile.plan`` checks. Raises ``BadInput`` for a bad profile or model
    folder (exit 2).
    """
    from escha_deploy.pipeline import Options, ProfileTarget, ThisHost, plan_request
    from escha_deploy.profile import load_profile

    profile = load_profile(ref, overrides)
    hw = profile.hardware
    # Plan without saved findings: a plan capped by an earlier ceiling would aim the ladder at
    # that ceiling, so a ceiling once seen could never be measured again.
    # the figures, not an argv: doctor runs no server, so the rendered argv is not checked
    result = plan_request(profile, ThisHost(findings=False, server_here=False), ProfileTarget(),
                          Options(check_argv=False)).plan
    problems = tuple(result.reasons) if result.verdict == "unsafe" else ()
    pinned = result.per_rank.pinned_bytes if result.hicache.enabled else None
    buffers = tuple(b.requested_bytes for b in result.per_rank.host_buffers)
    b = result.budget
    commit = result.pinned_total_bytes + b.server_processes_bytes + b.os_reserve_bytes + b.l3_store_bytes
    return ProfileNeeds(pinned_buffer_bytes=buffers, commit_bytes=commit,
                        kv_page_bytes=result.page_size * result.per_rank.device_kv_bytes_per_token,name=profile.name, gpu_count=hw.gpu_count, gpu_vram_bytes=hw.gpu_vram,
                        gpu_name=hw.gpu_name, tp_size=profile.runtime.tp_size,
                        hicache_enabled=profile.hicache.enabled, pinned_per_rank_bytes=pinned or None,
                        plan_problems=problems, ref=ref, page_cache_floor_bytes=profile.safety.page_cache_floor,
                        compute_capability=hw.compute_capability,
                        gpu_ids=None if isinstance(profile.container.gpus, str) else tuple(profile.container.gpus))


def _now() -> _dt.datetime:
    return _dt.datetime.now(_dt.timezone.utc)


def pinned_target(facts: DoctorFacts, need: ProfileNeeds | None) -> int:
    """Bytes the pinned ladder aims at: the profile's planned per-rank host pools (else
    ``DEFAULT_PINNED_TARGET_BYTES``), capped at MemAvailable minus the page-cache floor (the
    profile's ``safety.page_cache_floor``, else the default policy's 2 GiB) so the probe never
    drives the box into swap."""
    target = (need.pinned_per_rank_bytes if need and need.pinned_per_rank_bytes else DEFAULT_PINNED_TARGET_BYTES)
    if facts.memory and facts.memory.mem_available_bytes is not None:
        floor = need.page_cache_floor_bytes if need else PAGE_CACHE_FLOOR_BYTES
        room = facts.memory.mem_available_bytes - floor
        target = min(target, max(room, 256 * 2**20))
    return target


def _from_findings(saved: DoctorFindings) -> ProbeFacts:
    from .probes import PinnedCeiling

    pinned = None
    if saved.pinned_ceiling_bytes is not None:
        target = saved.pinned_ceiling_target_bytes or saved.pinned_ceiling_bytes
        pinned = PinnedCeiling(allocator=saved.pinned_ceiling_allocator or saved.host_allocator or "pinned",
                               target_bytes=target, step_bytes=0, largest_bytes=saved.pinned_ceiling_bytes,
                               reached=saved.pinned_ceiling_reached)
    nccl = []
    if saved.nccl_smoke_ok is not None:
        nccl = [{"ok": saved.nccl_smoke_ok, "env": saved.nccl_env, "world_size": 2, "seconds": 0,
                 "error": None if saved.nccl_smoke_ok else "failed (saved result)"}]
    return ProbeFacts(source=f"saved {saved.created_at}", store=saved.store_probe,
                      device_attributes=saved.device_attributes, host_allocator=saved.host_allocator,
                      pinned=pinned, nccl=nccl, restore=saved.restore_bandwidth)


def _reusable(saved: DoctorFindings | None, target: int, world: int, now: _dt.datetime,
              driver_now: str | None = None) -> bool:
    if saved is None or not saved.is_fresh(now, driver_now) or not saved.store_probe:
        return False
    ceiling_covers = saved.pinned_ceiling_bytes is not None and (
        saved.pinned_ceiling_reached or saved.pinned_ceiling_bytes >= target)
    nccl_covers = world < 2 or saved.nccl_smoke_ok is not None
    return ceiling_covers and nccl_covers


def run_probes(facts: DoctorFacts, need: ProfileNeeds | None, *, reuse: bool = True,
               findings_path: Path | None = None, now: _dt.datetime | None = None) -> ProbeFacts:
    """Store probe, pinned ladder and (for 2+ GPUs) the all-reduce smoke test, or the saved
    answers for this host when they are younger than a day and cover this target."""
    if facts.gpus.count == 0:
        return ProbeFacts(skipped="no GPU")
    target = pinned_target(facts, need)
    world = need.tp_size if need else min(facts.gpus.count, 2)
    if reuse and findings_path is not None:
        saved = load_findings(findings_path, host_id=facts.host_id)
        if _reusable(saved, target, world, now or _now(), facts.gpus.driver_version):
            return _from_findings(saved)
    store, attributes = run_store_probe()
    # A probe that could not run in this Python (no torch, no CUDA device visible to it) is
    # unknown, never failed: the others need the same torch, so they are not started either.
    if why := next((r.error for r in store if not r.ran), None):
        return ProbeFacts(source="ran now", store=[r for r in store if r.ran], device_attributes=attributes,
                          unavailable=why)
    allocator = pick_allocator(store)
    pinned = run_pinned_ceiling(target, allocator=allocator or "pinned",
                                buffers=need.pinned_buffer_bytes if need else ())
    restore, restore_error = run_restore_probe(page_bytes=need.kv_page_bytes if need else None)
    if not pinned.ran:
        return ProbeFacts(source="ran now", store=store, device_attributes=attributes,
                          host_allocator=allocator, unavailable=pinned.error)
    nccl: list[dict] = []
    if world >= 2 and facts.gpus.count >= world:
        nccl = run_nccl_smoke(world, nccl_attempts(facts.gpus, facts.platform, world))
        if nccl and nccl[-1].get("ran") is False:
            return ProbeFacts(source="ran now", store=store, device_attributes=attributes, host_allocator=allocator,
                              pinned=pinned, nccl=nccl[:-1], unavailable=nccl[-1].get("error"))
    return ProbeFacts(source="ran now", store=store, device_attributes=attributes,
                      host_allocator=allocator, pinned=pinned, nccl=nccl, restore=restore,
                      restore_error=restore_error)


def build_report(facts: DoctorFacts, need: ProfileNeeds | None, now: _dt.datetime) -> DoctorReport:
    """Pure: the report for ``facts`` (and ``need`` when a profile was given)."""
    checks = host_checks(facts, need.page_cache_floor_bytes if need else PAGE_CACHE_FLOOR_BYTES)
    if need is not None:
        checks += profile_checks(facts, need)
    return DoctorReport(created_at=now.isoformat(), host_id=facts.host_id,
                        profile=need.name if need else None, checks=checks,
                        facts=facts.model_dump(mode="json"))


def probe_findings(probes: ProbeFacts, *, host_id: str, platform: str, created_at: str,
                   checks: Sequence[dict] = (), driver_version: str | None = None) -> DoctorFindings:
    """What ``plan`` and ``up`` read back (allocator, pinned ceiling, NCCL environment) from the
    probes' answers. ``up`` calls this with the *host's* id for probes it ran in the image
    (``python -m escha_deploy.doctor.probe_all``), since the container's hostname differs."""
    p = probes
    passed = next((a for a in p.nccl if a.get("ok")), None)
    return DoctorFindings(
        created_at=created_at, host_id=host_id, platform=platform,
        store_probe=p.store, host_allocator=p.host_allocator,
        pinned_ceiling_bytes=p.pinned.largest_bytes if p.pinned else None,
        pinned_ceiling_reached=bool(p.pinned and p.pinned.reached),
        pinned_ceiling_target_bytes=p.pinned.target_bytes if p.pinned else None,
        pinned_ceiling_allocator=p.pinned.allocator if p.pinned else None,
        device_attributes=p.device_attributes,
        nccl_env=dict(passed["env"]) if passed else {},
        nccl_smoke_ok=p.nccl_ok,
        checks=list(checks),
        restore_bandwidth=p.restore,
        driver_version=driver_version,
    )


def findings_from(report: DoctorReport, facts: DoctorFacts) -> DoctorFindings:
    """The findings of a ``doctor`` run: its probes plus its checks."""
    return probe_findings(facts.probes, host_id=facts.host_id, platform=facts.platform,
                          created_at=report.created_at, checks=[c.model_dump() for c in report.checks],
                          driver_version=facts.gpus.driver_version)


def _image_reader(profile: str | None, overrides: Sequence[str], docker: Callable[[], DockerFacts]):
    """The reader of the server image's digest: the profile's ``container.image`` (default: the
    image ``escha-deploy build`` tags), asked only from the real daemon (a test that passes
    recorded docker answers gets ``None``, not this machine's images)."""
    if docker is not read_docker:
        return None
    from escha_deploy.profile import load_profile
    from escha_deploy.sglang.releases import image_tag

    from .hostinfo import read_image

    ref = load_profile(profile, overrides).container.image if profile else image_tag("hicache")
    return lambda: read_image(ref)


def _memlock_reader(profile: str | None, overrides: Sequence[str], docker: Callable[[], DockerFacts]):
    """The daemon's memlock probe (``hostinfo.probe_memlock``) from the profile's
    ``container.image``, else the base ``up`` builds on (``runtime.base_image``); without a
    profile the image ``escha-deploy build`` tags, then the stock base. Asked only of the real
    daemon, as ``_image_reader``."""
    if docker is not read_docker:
        return None
    from escha_deploy.profile import load_profile

    from .hostinfo import probe_memlock

    if profile:
        p = load_profile(profile, overrides)
        images = [p.container.image, p.runtime.base_image]
    else:
        from escha_deploy.sglang.releases import image_tag, official_image

        images = [image_tag("hicache"), official_image()]
    return lambda: probe_memlock(list(dict.fromkeys(images)))


def run_doctor(profile: str | None = None, overrides: Sequence[str] = (), *, probes: bool = True,
               reuse: bool = True, save: bool = True, root: Path = Path("/"),
               environ: Mapping[str, str] | None = None, findings_path: Path | None = None,
               docker: Callable[[], DockerFacts] = read_docker,
               gpus: Callable[[], GpuInventory] = gpu_inventory,
               started: Callable[[], None] | None = None) -> DoctorReport:
    """``escha-deploy doctor``: gather, probe, report; save findings when probes ran now (never
    when they could not run in this Python: ``ProbeFacts.unavailable``).

    ``findings_path`` defaults to ``paths.doctor_findings_path()``. Raises ``BadInput`` for a
    bad profile before anything is gathered or probed; everything the box lacks is a check, not
    an exception. ``started`` is called once the profile is valid, before gathering (the CLI's
    progress line).
    """
    from escha_deploy.utils.paths import doctor_findings_path

    findings_path = findings_path or doctor_findings_path()
    need = needs_from_profile(profile, overrides) if profile else None
    if started is not None:
        started()
    facts = gather_facts(root, environ, docker=docker, gpus=gpus, image=_image_reader(profile, overrides, docker),
                         memlock_probe=_memlock_reader(profile, overrides, docker))
    if probes:
        facts.probes = run_probes(facts, need, reuse=reuse, findings_path=findings_path)
    else:
        facts.probes = ProbeFacts(skipped="--no-probes")
    report = build_report(facts, need, _now())
    # never save an unknown: a probe that could not run here is no finding for plan or up
    if save and facts.probes.source == "ran now" and facts.probes.unavailable is None:
        save_findings(findings_from(report, facts), findings_path)
        report.findings_saved = True
    return report
