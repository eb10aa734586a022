"""The `serve` path: the container's entrypoint and the native launcher.

Two ways in, one way out:

- ``serve_spec(PATH)`` (``serve --spec``, what ``up`` starts): reads the ``LaunchSpec`` the
  host planned, refuses a schema version this escha-deploy cannot read (exit 3, naming both) or
  a spec whose digest does not match its content, and re-plans nothing.
- ``serve(PROFILE)`` (``serve --profile``: native, or a compose container): plans on the spot
  through the same pipeline as ``up`` (``escha_deploy.pipeline``: gather -> decide -> render), from a facts
  file when one is given (``--facts``, ``ESCHA_FACTS``).

Both then check what this environment can see against what the plan assumed
(``launch.check``: capabilities, GPUs, memory, memlock, the model folder; exit 3 per
disagreement, 2 for a bad model folder) and run SGLang's argv as a supervised child
(``native.supervise``: signals forwarded, secrets redacted, a failed exit diagnosed). Once the
server is ready, ``serve --profile`` runs the drift check ``up`` runs (``drift_at_ready``);
with ``--spec`` the ``up`` that wrote the spec runs it.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from escha_deploy.utils.errors import BadInput, Failed, Refused
from escha_deploy.utils.secretargs import redact_argv

from .check import SKIP_GPU_PREFLIGHT_ENV  # noqa: F401 - the documented test switch, re-exported
from .sglang_preflight import PREFLIGHT_ENV  # noqa: F401 - the switch (documented there), re-exported
from .prepare import read_secret
from .progress import Report, quiet
from escha_deploy.utils.redact import Redactor

if TYPE_CHECKING:
    from escha_deploy.pipeline.spec import LaunchSpec

    from .drift import PlannedSizes


def read_spec(path: str | Path) -> LaunchSpec:
    """Read a launch-spec document. Raises ``BadInput`` (2) when it is not readable JSON;
    ``Refused`` (3) when its schema version is not the one this escha-deploy reads (both named),
    when it does not validate, or when its digest does not match its content."""
    from pydantic import ValidationError

    from escha_deploy import __version__
    from escha_deploy.pipeline.spec import LAUNCH_SPEC_SCHEMA_VERSION, LaunchSpec, launch_digest

    from escha_deploy.utils.jsonio import read_json

    p = Path(path)
    data = read_json(p, "the launch spec (--spec)")
    version = data.get("schema_version") if isinstance(data, dict) else None
    if version != LAUNCH_SPEC_SCHEMA_VERSION:
        writer = data.get("escha_version") if isinstance(data, dict) else None
        raise Refused(
            f"{p}: launch spec schema version {version!r}"
            + (f" (written by escha-deploy {writer})" if writer else "")
            + f"; this escha-deploy {__version__} reads schema version {LAUNCH_SPEC_SCHEMA_VERSION}",
            hint="run the same escha-deploy on the host and in the image: rebuild the image "
                 "(`escha-deploy build --hicache`) or install the image's version on the host")
    try:
        spec = LaunchSpec.model_validate(data)
    except ValidationError as exc:
        raise Refused(*(f"{p}: {'.'.join(str(x) for x in e['loc'])}: {e['msg']}" for e in exc.errors())) from None
    if launch_digest(spec.profile_data, spec.facts, spec.argv, spec.env, spec.preflight) != spec.plan_digest:
        raise Refused(f"{p}: plan_digest does not match the spec's profile, facts, argv, env and pre-flight figures "
                      "(edited after planning?)", hint="plan again: `escha-deploy up`")
    return spec


def _runtime_capabilities() -> tuple[list[str] | None, str]:
    """This runtime's capabilities (``None``: stock) and how to name it in messages."""
    from escha_deploy.runtime.description import read_description

    from escha_deploy.sglang.capabilities import runtime_description_path

    path = runtime_description_path()
    desc = read_description(path)
    if desc is None:
        return None, f"this runtime (stock: no {path})"
    if desc.kind == "closure":
        return list(desc.capabilities), f"this runtime (a serving closure, {path})"
    return list(desc.capabilities), f"this runtime ({path})"


def runtime_release() -> tuple[str | None, str]:
    """The SGLang release this runtime runs and where that was read: its runtime description's
    ``sglang_version`` (``runtime apply`` records the installed dist-info's); ``(None, ...)``
    for a runtime without one (nothing to compare: finding sglang would run its interpreter)."""
    from escha_deploy.sglang.capabilities import runtime_description_path
    from escha_deploy.runtime.description import read_description

    path = runtime_description_path()
    desc = read_description(path)
    if desc is not None and desc.sglang_version:
        return desc.sglang_version, f"this runtime ({path})"
    return None, f"this runtime (no {path})"


def check_release(planned: str | None, path: str | Path) -> None:
    """``Refused`` (exit 3, both named) when this runtime's SGLang release is not the one the
    launch spec at ``path`` was planned for; nothing to check when either is unknown."""
    running, where = runtime_release()
    if running:
        from escha_deploy.sglang.releases import is_built_version, nearest_release

        if is_built_version(running):  # built from a commit: planned with its nearest release
            running = nearest_release(running, where)
    if planned and running and planned != running:
        raise Refused(f"SGLang release: {where} runs {running}, but the launch spec {path} was planned for "
                      f"{planned}", hint=f"plan for this image (`escha-deploy up` reads its release), or run an "
                      f"image of SGLang {planned}")


def serve_spec(path: str | Path, *, dry_run: bool = False, report: Report = quiet) -> int:
    """``serve --spec PATH``: run the plan the host made (module docstring); returns the exit
    status. ``dry_run`` (``--print``) prints the argv, env and digest, then exits 3 if any
    check disagrees. A runtime of another SGLang release than the plan's is refused (exit 3)."""
    launch = read_spec(path)
    check_release(launch.facts.sglang_release, path)
    caps, where = _runtime_capabilities()
    report("info", f"serve: {launch.profile}: plan digest {launch.plan_digest} from {path} "
                   f"(escha-deploy {launch.escha_version})")
    from .sglang_preflight import spec_device

    # the sizing stages of SGLang's pre-flight: the figures the host's plan recorded in the spec
    device = spec_device(launch.preflight)
    return _check_and_run(launch, caps, where, dry_run=dry_run, report=report,
                          extra={"preflight_device": device}, device=device)


def serve(profile_ref: str, overrides: Sequence[str] = (), *, dry_run: bool = False,
          facts_path: str | None = None, report: Report = quiet) -> int:
    """``serve --profile``: plan here through ``escha_deploy.pipeline`` (as ``up`` does), then check and
    run (module docstring); returns the exit status. Inside a container (``ESCHA_SERVE_MODE``)
    the model folder is read at ``model.path``; natively at ``model.host_dir``. ``--print``
    always shows what the plan implies for the runtime the profile targets; the missing
    capabilities then go to stderr with exit 3. Natively, a second ``serve`` on the same port
    is refused (3, ``native.server_lock``), and nothing of the server or its secrets file
    outlives this process (``native`` module)."""
    from escha_deploy.pipeline import (DescribedHost, InContainer, LaunchOptions, Options, RuntimeClaim, facts_source,
                                       hicache_off_warning, plan_request, secret_path_problems)
    from escha_deploy.profile import load_profile
    from escha_deploy.runtime.description import require_capabilities

    from .docker import SERVE_MODE_ENV

    profile = load_profile(profile_ref, overrides)
    caps, where = _runtime_capabilities()
    missing = [c for c in profile.runtime.needs if c not in (caps or [])]
    in_container = os.environ.get(SERVE_MODE_ENV) == "container"
    if not dry_run:
        require_capabilities(caps, profile.runtime.needs, where, native=False if in_container else None)
    # plan the runtime this is (a fork image without our host-reserve patch gets stock
    # 0.5.19's host check and no ESCHA_* variable it would not read); with no description,
    # --print shows what the plan implies for the runtime the profile targets. Missing
    # capabilities then go to stderr with exit 3.
    # inside the container the model folder is mounted at model.path, the L3 directory at
    # flags.CONTAINER_L3_DIR (pipeline.InContainer); the server runs here, so the L3 directory
    # is checked here
    secret_path_problems(profile)
    here = facts_source(facts_path, launch=True)
    assert not isinstance(here, (InContainer, DescribedHost))
    running, release_where = runtime_release()
    claim = RuntimeClaim(running, release_where, tuple(caps) if caps is not None
                         else tuple(profile.runtime.needs if missing else ()), where,
                         "runtime_description" if caps is not None else "default")
    req = plan_request(profile, InContainer(here) if in_container else here, claim,
                       Options(launch=LaunchOptions(native=not in_container)))
    if req.gathered.l3_refusals:  # the server runs here: its L3 directory must do (exit 3)
        raise Refused(*req.gathered.l3_refusals)
    plan, launch = req.plan, req.launch
    assert launch is not None
    if plan.verdict == "unsafe" and not dry_run:
        raise Refused(*plan.refusal_lines())
    if (off := hicache_off_warning(plan)) is not None:
        report("warning", off)
    for note in req.runtime.notes:  # a runtime built from a commit: what it is, what was not checked (once)
        report("warning", note)
    # a size SGLang caps rather than refuses (planner._cap_fixed_tokens): said as plan and compose say it
    for w in plan.warnings:
        if w.startswith("runtime.max_total_tokens:"):
            report("warning", f"plan: {w}")
    report("info", f"serve: {profile.name}: plan digest {launch.plan_digest} ({plan.verdict}), planned here")
    # the container settings `up` refuses (docker.check_spec), natively the one about binding
    # beyond loopback without an API key: exit 3 before anything starts, --print included
    from .docker import check_spec

    if settings := check_spec(launch.container, native=not in_container):
        if dry_run:
            _print(launch, *_secrets(launch), extra={"verdict": plan.verdict, "missing_capabilities": missing},
                   refusals=settings)
        raise Refused(*settings)
    from .sglang_preflight import device_figures

    device = device_figures(plan)  # the sizing stages of SGLang's pre-flight: the plan's figures
    if dry_run and (missing or plan.verdict == "unsafe"):
        _print(launch, *_secrets(launch), extra={"verdict": plan.verdict, "missing_capabilities": missing,
                                                 "preflight_device": device},
               refusals=plan.refusal_lines() if plan.verdict == "unsafe" else ())
        require_capabilities(caps, profile.runtime.needs, where, native=False if in_container else None)
        return 3
    from escha_deploy.launch.planview import plan_view

    from .prepare import planned_sizes

    return _check_and_run(launch, caps, where, dry_run=dry_run, report=report,
                          extra={"verdict": plan.verdict, "missing_capabilities": missing, "preflight_device": device},
                          view=plan_view(plan, launch.plan_digest, profile.watch), device=device,
                          planned=planned_sizes(plan, profile.runtime))


def _secrets(launch: LaunchSpec) -> tuple[str | None, str | None]:
    """The API key and HF token the spec's files hold: ``BadInput`` (exit 2, one line naming
    the file, never its bytes) when a named file is missing, unreadable or not one value
    (``prepare.read_secret``), the HF token's as the API key's: a server started without the
    token the profile names would fail later, at a gated model's download, with no word of why."""
    api_key = read_secret(launch.api_key_file, "api key file") if launch.api_key_file else None
    hf_token = read_secret(launch.hf_token_file, "hf token file") if launch.hf_token_file else None
    return api_key, hf_token


def _print(launch: LaunchSpec, api_key: str | None, hf_token: str | None, *, extra: dict | None = None,
           refusals: Sequence[str] = ()) -> None:
    r = Redactor([api_key or "", hf_token or ""])
    print(json.dumps({"plan_digest": launch.plan_digest, "argv": [r(a) for a in redact_argv(launch.argv)],
                      "env": {k: r(v) for k, v in launch.env.items()}, **(extra or {}),
                      "refusals": list(refusals)}, indent=2))


def sglang_preflight(launch: LaunchSpec, argv: list[str], env: dict[str, str], report: Report,
                     device: dict[str, int] | None = None) -> None:
    """Ask SGLang itself, in its own interpreter (``argv[0]``) and with the server's environment,
    whether it starts on ``argv``: argument resolution, model config and attention backend, and
    with the plan's ``device`` figures (``sglang_preflight.device_figures``, native ``serve``;
    ``sglang_preflight.spec_device``, the ones the launch spec records, ``serve --spec``)
    the KV cache configurator's and the host pools' sizing (``launch.sglang_preflight``),
    before the first weight loads. Raises ``Refused`` (exit 3)
    with SGLang's message, its ``file:function`` and the profile key or ``extra_args`` item
    that set the input, or ``Internal`` (exit 1) for a fault of the pre-flight's own code
    (``image_preflight.failure``: its traceback in a log file, no profile key named); an
    interpreter without a working SGLang (a build-only image) is
    reported and the server starts as before. ``ESCHA_SGLANG_PREFLIGHT=0`` skips it;
    ``ESCHA_SGLANG_PREFLIGHT_TIMEOUT`` (seconds, default 240) is how long it may take.
    Raises ``BadInput`` (exit 2) for a timeout that is not a number of seconds."""
    from .image_preflight import failure, passed_line
    from .sglang_preflight import run, server_flags_of, timeout_from_env

    from .check import SKIP_GPU_PREFLIGHT_ENV as skip_gpu

    switch = os.environ.get(PREFLIGHT_ENV)
    if switch == "0" or (switch != "1" and os.environ.get(skip_gpu) == "1"):
        why = f"{PREFLIGHT_ENV}=0" if switch == "0" else f"{skip_gpu}=1: no GPU for SGLang's platform"
        report("info", f"serve: SGLang's pre-flight skipped ({why})")
        return
    if not argv or "-m" not in argv:
        return
    from .sglang_preflight import SIZING, STAGES

    stages = STAGES if device else tuple(s for s in STAGES if s not in SIZING)
    report("info", f"serve: SGLang's pre-flight ({', '.join(stages)}; no weights, no NCCL)")
    if not device:
        report("info", f"serve: SGLang's pre-flight: {' and '.join(SIZING)} skipped (the launch spec "
                       "records no pre-flight figures: written by an escha-deploy before they were recorded)")
    res = run(argv[0], server_flags_of(argv), env, device=device, timeout_s=timeout_from_env())
    if res.ok is None:
        report("warning", f"serve: SGLang's pre-flight did not run: {res.not_run}; starting without its answer")
        return
    if not res.ok:
        raise failure(res, launch.profile_data, report)
    report("info", f"serve: SGLang's pre-flight {passed_line(res)}")


def drift_at_ready(launch: LaunchSpec, planned: PlannedSizes, api_key: str | None,
                   report: Report) -> Callable[[list[str]], None]:
    """``serve --profile``'s drift check, the one ``up`` runs once its server is ready
    (``drift.check``, ``DriftReport.report_lines``: the same lines, and the exit status is left
    to the server): called by ``native.supervise`` with the server's lines up to its ready line,
    it waits for the server's first healthy answer (``ready.read_server_info``: a cold SGLang
    compiles kernels after its ready line; at most ``ESCHA_HEALTHY_WAIT`` seconds, progress
    shown), reads ``/server_info`` on the address the server binds (loopback for a wildcard
    bind) and reports, naming a half it could not compare and why. Raises ``BadInput`` (exit
    2) when called, before the pre-flight and the start, for an ``ESCHA_HEALTHY_WAIT`` that is
    not seconds."""
    from escha_deploy.utils.netaddr import url as http_url

    from .drift import check
    from .ready import Probe, healthy_wait_from_env, read_server_info

    wait_s = healthy_wait_from_env()
    c = launch.container
    endpoint = http_url("127.0.0.1" if c.port_host_ip in ("0.0.0.0", "127.0.0.1") else c.port_host_ip,
                        c.port_host)

    def on_ready(lines: list[str]) -> None:
        got = read_server_info(Probe(endpoint, api_key), wait_s=wait_s,
                               progress=lambda line: report("info", f"serve: {line}"))
        for level, line in check(planned, lines, got.info, got.why).report_lines("serve"):
            report(level, line)

    return on_ready


def _check_and_run(launch: LaunchSpec, caps: list[str] | None, where: str, *, dry_run: bool,
                   report: Report, extra: dict | None = None, view=None, device: dict[str, int] | None = None,
                   planned: PlannedSizes | None = None) -> int:
    from escha_deploy.pipeline import argv as flags
    from escha_deploy.profile import key_env

    from .check import check_here
    from .diagnose import Facts, launch_settings
    from .docker import SERVE_MODE_ENV
    from .native import serve_log_path, server_lock, supervise, sweep_secret_dirs, tmpfs_root

    in_container = os.environ.get(SERVE_MODE_ENV) == "container"

    checked = check_here(launch, caps, where=where, gpus=not dry_run)
    for w in checked.warnings:
        report("warning", w)
    api_key, hf_token = _secrets(launch)
    if dry_run:
        _print(launch, api_key, hf_token, extra={"verdict": launch.verdict, **(extra or {})},
               refusals=[*checked.bad_input, *checked.refusals])
    if checked.bad_input:
        raise BadInput(*checked.bad_input)
    if checked.refusals:
        raise Refused(*checked.refusals)
    if dry_run:
        return 0
    env = dict(os.environ)
    env.update(launch.env)
    env["NO_PROXY"] = env["no_proxy"] = flags.merged_no_proxy(os.environ)  # keep the user's entries
    if hf_token:
        env[key_env("container.hf_token_file")] = hf_token
    argv = list(launch.argv)
    if os.environ.get("ESCHA_SGLANG_PYTHON") and argv and argv[0].startswith("python"):
        argv[0] = os.environ["ESCHA_SGLANG_PYTHON"]
    if not in_container:  # in the container Docker bound the published port already
        from .preflight import port_free

        # natively the server binds the spec's host address and port (build_launch_spec renders them into the argv)
        port_free(launch.container.port_host_ip, launch.container.port_host)
    # read ESCHA_HEALTHY_WAIT now: a bad value is exit 2 before the pre-flight and the start
    on_ready = drift_at_ready(launch, planned, api_key, report) if planned is not None else None
    sglang_preflight(launch, argv, env, report, device)
    report("info", f"serve: {launch.profile}: plan {launch.verdict}, "
                   f"HiCache {'on' if launch.hicache_enabled else 'off'}; starting SGLang")
    # Natively: one `serve` per port (a file lock), secrets on tmpfs, and a sweep of what a
    # `serve` killed before its server was ready left; in the container Docker arbitrates.
    with contextlib.ExitStack() as stack:
        root = None if in_container else tmpfs_root()
        state = None
        try:
            lock_fd = None if in_container else stack.enter_context(server_lock(launch.container.port_host))
            for d in sweep_secret_dirs(root):
                report("info", f"serve: removed {d}, left by a `serve` that was killed before its server was ready")
            state = None if in_container else _write_state(launch, view)
            log_path = None if in_container else serve_log_path(launch.container.port_host)
        except OSError as exc:
            raise _runtime_folder_refusal(exc) from None
        try:
            outcome = supervise(argv, env=env, secrets=[s for s in (api_key, hf_token) if s],
                                config_flag=flags.CONFIG_FLAG, config_secrets=flags.secret_config(api_key),
                                facts=Facts(hicache_enabled=launch.hicache_enabled, platform=launch.facts.platform,
                                            launch=launch_settings(launch, native=not in_container)),
                                secret_root=root, lock_fd=lock_fd,
                                grace_s=float(launch.container.stop_timeout_s),
                                on_ready=on_ready, log_path=log_path)
        except OSError as exc:
            if root is not None and exc.filename and str(exc.filename).startswith(str(root)):
                raise _runtime_folder_refusal(exc) from None  # the secrets file or the log: nothing started
            raise Failed(f"serve: cannot start {argv[0] if argv else 'the server'}: {exc}") from None
        finally:
            if state is not None:
                from escha_deploy.launch.serve_state import remove_state

                remove_state(state.port, state.pid)
    return outcome.exit_code


def _runtime_folder_refusal(exc: OSError) -> Refused:
    """A native ``serve`` that cannot write in its runtime folder (``native.runtime_dir``:
    ``$XDG_RUNTIME_DIR``, else ``/dev/shm``; a full tmpfs, a read-only mount, no permission):
    ``Refused`` (exit 3), one line naming the folder and the system's reason; nothing started.
    The port lock, the state file, the secrets file and the log go there."""
    from .native import tmpfs_root

    root = tmpfs_root()
    where = (f"$XDG_RUNTIME_DIR ({root})" if root is not None and str(root) == os.environ.get("XDG_RUNTIME_DIR")
             else str(root or "the temporary folder"))
    return Refused(f"serve: cannot write in {where}: {exc.strerror or exc}; nothing was started",
                   hint="free space there, or set XDG_RUNTIME_DIR to a folder of yours on a tmpfs "
                   "with room (the port lock, the state file, the secrets file and the log go there)")


def _write_state(launch: LaunchSpec, view):
    """Native: the state file ``status`` finds this server by (``serve_state``)."""
    import time

    from escha_deploy.launch.planview import PlanView
    from escha_deploy.launch.serve_state import ServeState, write_state

    if view is None:  # serve --spec: the spec's own figures
        view = PlanView(profile=launch.profile, plan_digest=launch.plan_digest, tp_size=max(launch.needs.gpus, 1),
                        hicache_enabled=launch.hicache_enabled)
    state = ServeState(pid=os.getpid(), host=launch.container.port_host_ip, port=launch.container.port_host,
                       profile=launch.profile, plan_digest=launch.plan_digest, api_key_file=launch.api_key_file,
                       started_at=time.time(), plan=view)
    write_state(state)
    return state
