"""The `serve` path: the container's entrypoint and the native launcher.

``serve`` runs SGLang's server as a supervised child (``native.supervise``: signals forwarded,
secrets redacted, a failed exit diagnosed) after refusing, with exit 3 and nothing started,
an unsafe plan, missing capabilities or a missing GPU.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Sequence
from pathlib import Path

from escha_deploy.errors import Failed, Refused
from escha_deploy.secretargs import redact_argv

from .prepare import read_secret
from .progress import Report, quiet
from .redact import Redactor

#: The documented test switch: `serve` skips its GPU preflight (so the real image can be
#: started on a machine without a GPU and reach SGLang's child process). Never set in production.
SKIP_GPU_PREFLIGHT_ENV = "ESCHA_SKIP_GPU_PREFLIGHT"


def gpu_present() -> bool:
    """A CUDA device node exists (``/dev/nvidia0``, or ``/dev/dxg`` under WSL2)."""
    return Path("/dev/nvidia0").exists() or Path("/dev/dxg").exists()


def serve(profile_ref: str, overrides: Sequence[str] = (), *, dry_run: bool = False,
          report: Report = quiet) -> int:
    """The container entrypoint and native launcher; returns the exit status.

    Re-plans against what it sees (host facts read inside the container: cgroup limit,
    /dev/shm, the image's runtime description at /etc/escha/runtime.json), refuses (3) an
    unsafe plan or missing capabilities before anything starts, then runs SGLang's argv as a
    supervised child (``native.supervise``): 0 on success, the child's code after a forwarded
    signal, 4 on any other failure with the diagnosis printed. ``ESCHA_SKIP_GPU_PREFLIGHT=1``
    (tests only) skips the GPU check. The API key (from ``LaunchSpec.api_key_file``) reaches
    SGLang through a private ``--config`` file, never a command line; the HF token through
    the child's environment (``HF_TOKEN``). Progress and warnings go to ``report``.
    Natively, a second ``serve`` on the same port is refused (3, ``native.server_lock``), and
    nothing of the server or its secrets file outlives this process (``native`` module).
    """
    from escha_deploy import flags
    from escha_deploy.host import gather_plan_inputs
    from escha_deploy.launch_spec import build_launch_spec
    from escha_deploy.planner import plan as make_plan
    from escha_deploy.profile import load_profile
    from escha_deploy.runtime.description import read_description, require_capabilities

    from .diagnose import Facts
    from .native import server_lock, supervise, sweep_secret_dirs, tmpfs_root

    profile = load_profile(profile_ref, overrides)
    desc = read_description()
    caps = list(desc.capabilities) if desc is not None else None
    where = ("this runtime (/etc/escha/runtime.json)" if desc is not None
             else "this runtime (stock: no /etc/escha/runtime.json)")
    missing = [c for c in profile.runtime.needs if c not in (caps or [])]
    if not dry_run:
        require_capabilities(caps, profile.runtime.needs, where)
    from .docker import SERVE_MODE_ENV

    in_container = os.environ.get(SERVE_MODE_ENV) == "container"
    # inside the container the model folder is mounted at model.path
    host, model_dir = gather_plan_inputs(profile, model_path=profile.model.path if in_container else None)
    # plan the runtime this is (a fork image without our host-reserve patch gets stock
    # 0.5.19's host check and no ESCHA_* variable it would not read); with no description,
    # --print shows what the plan implies for the runtime the profile targets. Missing
    # capabilities then go to stderr with exit 3.
    plan = make_plan(profile, host, model_dir=model_dir,
                     capabilities=frozenset(caps) if caps is not None
                     else frozenset(profile.runtime.needs if missing else ()))
    if plan.verdict == "unsafe" and not dry_run:
        raise Refused(*[f"plan: {r}" for r in plan.reasons] or ["plan: unsafe"])
    if plan.verdict == "hicache_off":
        report("warning", "plan: HiCache is off here (" + "; ".join(plan.reasons) + ")")
    spec = build_launch_spec(plan, profile, native=not in_container)
    api_key = read_secret(spec.api_key_file, "api key file") if spec.api_key_file else None
    hf_token = (read_secret(spec.hf_token_file, "hf token file")
                if spec.hf_token_file and Path(spec.hf_token_file).is_file() else None)
    env = dict(os.environ)
    env.update(spec.env)
    if hf_token:
        env["HF_TOKEN"] = hf_token
    argv = list(spec.argv)
    if os.environ.get("ESCHA_SGLANG_PYTHON") and argv and argv[0].startswith("python"):
        argv[0] = os.environ["ESCHA_SGLANG_PYTHON"]
    if dry_run:
        r = Redactor([api_key or "", hf_token or ""])
        print(json.dumps({"argv": [r(a) for a in redact_argv(argv)], "env": {k: r(v) for k, v in spec.env.items()},
                          "verdict": plan.verdict, "missing_capabilities": missing}, indent=2))
        require_capabilities(caps, profile.runtime.needs, where)
        return 3 if plan.verdict == "unsafe" else 0
    if not gpu_present() and os.environ.get(SKIP_GPU_PREFLIGHT_ENV) != "1":
        raise Refused("serve: no CUDA GPU device in this environment (/dev/nvidia0, /dev/dxg)",
                      hint="start the container with GPUs (escha-deploy up does)")
    report("info", f"serve: {profile.name}: plan {plan.verdict}, HiCache {'on' if plan.hicache.enabled else 'off'}; "
         "starting SGLang")
    # Natively: one `serve` per port (a file lock), secrets on tmpfs, and a sweep of what a
    # `serve` killed before its server was ready left; in the container Docker arbitrates.
    lock = contextlib.nullcontext(None) if in_container else server_lock(profile.container.port)
    with lock as lock_fd:
        root = None if in_container else tmpfs_root()
        for d in sweep_secret_dirs(root):
            report("info", f"serve: removed {d}, left by a `serve` that was killed before its server was ready")
        try:
            outcome = supervise(argv, env=env, secrets=[s for s in (api_key, hf_token) if s],
                                config_flag=flags.CONFIG_FLAG, config_secrets=flags.secret_config(api_key),
                                facts=Facts(hicache_enabled=plan.hicache.enabled, platform=plan.platform),
                                secret_root=root, lock_fd=lock_fd,
                                grace_s=float(profile.container.stop_timeout_s))
        except OSError as exc:
            raise Failed(f"serve: cannot start {argv[0] if argv else 'the server'}: {exc}") from None
    return outcome.exit_code
