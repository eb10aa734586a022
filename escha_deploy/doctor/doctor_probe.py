"""Doctor's GPU probes in the profile's image, as `up` runs them before it plans the server that
starts (its preflight's ``doctor probes`` check). Doctor sits above launch in the import contract
(.importlinter), so `up` does not import this module: its callers (the CLI's `up`, `fleet up
--box`, `bench --hicache-ab`) hand ``doctor_in_image`` to ``launch.up.up``."""

from __future__ import annotations

import json

from escha_deploy.utils.errors import Inconclusive, Refused
from escha_deploy.launch.prepare import Prepared
from escha_deploy.launch.progress import Report, quiet


def doctor_in_image(client, prep: Prepared, *, timeout_s: float = 600, report: Report = quiet) -> bool:
    """Doctor's GPU probes inside the profile's image (its cgroup, /dev/shm, memlock and WSL2
    pinned ceiling are what count), reusing saved findings younger than a day
    (``findings.MAX_AGE``). Runs ``python -m escha_deploy.doctor.probe_all``
    in a throw-away container with the launch's GPUs, ipc and ulimits; saves the answer as
    findings under the host's id. A failed all-reduce smoke test refuses (exit 3) before the
    server is created. Returns True when the probes ran now (the findings changed), False when
    saved findings were fresh. Only reached where Docker has a GPU runtime (not testable here).
    """
    from escha_deploy.facts.saved import save_findings
    from escha_deploy.facts.machine import host_id
    from escha_deploy.launch import docker as dk
    from escha_deploy.launch.up import fresh_findings_saved
    from escha_deploy.utils.paths import doctor_findings_path

    from .facts import ProbeFacts
    from .run import probe_findings

    hid = host_id()
    if fresh_findings_saved():
        report("info", "up: reusing doctor findings younger than a day")
        return False
    world = int(prep.profile.runtime.tp_size)
    target = int(prep.plan.per_rank.pinned_bytes) or 1
    args = {k: v for k, v in prep.args.items()
            if k in ("image", "device_requests", "ipc_mode", "shm_size", "ulimits", "security_opt",
                     "environment", "init")}
    args.update(entrypoint=["python3", "-m", "escha_deploy.doctor.probe_all"],
                command=["--target", str(target), "--world-size", str(world)],
                labels={dk.LABEL_MANAGED_BY: "escha-deploy-doctor"}, detach=True)
    report("info", f"up: running doctor's probes in {prep.spec.image}")
    c = client.containers.create(**dk.to_docker({**args, "mounts": [], "ulimits": args["ulimits"]}))
    try:
        c.start()
        code = c.wait(timeout=timeout_s)["StatusCode"]
        out = c.logs(stdout=True, stderr=False).decode().strip().splitlines()
    finally:
        c.remove(force=True)
    if code != 0 or not out:
        raise Refused(f"doctor: probes in {prep.spec.image} found no usable GPU (exit {code})",
                      hint=f"`escha-deploy doctor --profile {prep.profile_ref}` shows the checks")
    data = json.loads(out[-1])
    probes = ProbeFacts.model_validate(data["probes"])
    if probes.unavailable:  # unknown, never saved as a finding (doctor's rule)
        raise Inconclusive(f"doctor: the probes could not run in {prep.spec.image}: {probes.unavailable}",
                           hint="the server image needs torch with CUDA; "
                           f"`escha-deploy doctor --profile {prep.profile_ref}` shows the checks")
    import datetime as dt

    from escha_deploy.facts.machine import read_gpu_facts

    gpus = read_gpu_facts()  # the driver the probes ran under: the host's (the container shares its driver)
    findings = probe_findings(probes, host_id=hid, platform=data.get("platform", prep.plan.platform),
                              created_at=dt.datetime.now(dt.timezone.utc).isoformat(),
                              driver_version=gpus.driver_version if gpus is not None else None)
    save_findings(findings, doctor_findings_path())
    if world >= 2 and findings.nccl_smoke_ok is False:
        raise Refused(f"doctor: the {world}-GPU all-reduce smoke test failed in {prep.spec.image}",
                      hint=f"`escha-deploy doctor --profile {prep.profile_ref}` prints the NCCL settings it tried")
    return True
