"""SGLang's own pre-flight (``launch.sglang_preflight``) as `up`'s check ``sglang pre-flight``:
run in a throw-away container of the profile's image, with the launch's GPUs, environment and
mounts (the model folder), before the server's container is created.

`up` runs it and prints its time; ``up --dry-run`` runs it too when the image is here (the one
container a dry run makes: removed at once, no network) and says it runs at `up` when the image
is not. A refusal is `up`'s exit 3 with SGLang's message, its ``file:function`` and the profile
key; a fault of the pre-flight's own code (``PreflightResult.internal``) is exit 1, "internal error
in the pre-flight (please report)", with its traceback in a log file (``failure``); an image
whose SGLang does not import (a build-only image) is reported, not refused. Once
`up`'s check has SGLang's answer, the server's own ``serve --spec`` does not ask again
(``ESCHA_SGLANG_PREFLIGHT=0`` in the server container's environment).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

from escha_deploy.utils.errors import EschaError, Internal, Refused

from .prepare import Prepared
from .progress import Report, quiet
from . import sglang_preflight as pf
from .sglang_preflight import (PREFLIGHT_ENV, PreflightResult, internal_line, profile_keys_for, refusal_line,
                               server_flags_of)

#: The hint of a pre-flight refusal (``serve`` and `up`).
HINT = "SGLang would stop here at start; change the key named, then `escha-deploy plan` again"
#: The hint of a fault of the pre-flight's own code (``internal_error``): not the profile's doing.
INTERNAL_HINT = (f"this is a fault in escha-deploy's pre-flight, not in the profile: please report it with the "
                 f"traceback; {PREFLIGHT_ENV}=0 starts the server without the pre-flight")


def failure(res: PreflightResult, profile_data: dict, report: Report = quiet) -> EschaError:
    """The error for a pre-flight that did not pass (``res.ok`` False): ``internal_error`` (exit 1)
    for a fault of the pre-flight's own code, else SGLang's ``refusal`` (exit 3). What `up`,
    ``up --dry-run`` and ``serve`` raise."""
    if res.internal:
        return internal_error(res, report)
    return refusal(res, profile_data)


def refusal(res: PreflightResult, profile_data: dict) -> Refused:
    """The exit-3 refusal for SGLang's refusing answer ``res``: one line with the stage, SGLang's
    message and ``file:function``, and the profile key or ``extra_args`` item that set the input."""
    extra = list((profile_data.get("runtime") or {}).get("extra_args") or [])
    return Refused(refusal_line(res, profile_keys_for(res.flags, extra)), hint=HINT)


def internal_error(res: PreflightResult, report: Report = quiet) -> Internal:
    """The exit-1 error for a fault of the pre-flight's own code (``res.internal``): one line
    (``sglang_preflight.internal_line``) naming the exception, the harness function and the
    stage, and the log file its traceback went to (``fault_log``); in a container, or where that
    file cannot be written, the traceback goes to ``report`` (the container's log) instead."""
    log = fault_log(res)
    if log is None:
        report("warning", f"SGLang's pre-flight: {pf.INTERNAL}; its traceback:\n{_masked(res.traceback).rstrip()}")
    return Internal(internal_line(res, log), hint=INTERNAL_HINT)


def _masked(text: str) -> str:
    """``text`` with key-shaped values masked (``redact.Redactor``'s patterns): a traceback may
    quote an argv value."""
    from escha_deploy.utils.redact import Redactor

    return Redactor()(text)


def fault_log(res: PreflightResult) -> str | None:
    """Write a harness fault's traceback (masked, ``_masked``) with its stage, site and message to
    a new file ``preflight/internal-error-UTCSTAMP-PID.log`` under the user cache directory (mode
    0600) and return its path; None in a container (``ESCHA_SERVE_MODE=container``: its cache dies
    with it) or when the file cannot be written."""
    import time

    from escha_deploy.utils.paths import cache_dir

    from .docker import SERVE_MODE_ENV

    if os.environ.get(SERVE_MODE_ENV) == "container":
        return None
    d = cache_dir() / "preflight"
    path = d / f"internal-error-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{os.getpid()}.log"
    text = (f"{pf.INTERNAL}\nstage: {res.stage}\nsite: {res.site}\n{res.type}: {res.message}\n\n"
            f"{res.traceback}")
    try:
        d.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8", errors="replace") as f:
            f.write(_masked(text))
    except OSError:
        return None
    return str(path)


def passed_line(res: PreflightResult) -> str:
    """What SGLang answered when it passed, with the pre-flight's time (wall and SGLang's own)."""
    a = res.answers
    line = (f"passed in {res.wall_s:.1f} s (SGLang's own stages {res.seconds.get('total', 0):.1f} s): "
            f"attention backend {a.get('attention_backend')}, context length {a.get('context_length')}, "
            f"{a.get('architecture')}")
    if "max_total_num_tokens" in a:
        line += (f"; KV pool {a['max_total_num_tokens']} tokens ({a.get('kv_pool_bytes')} B), mamba "
                 f"{a.get('mamba_slots')} slots ({a.get('mamba_pool_bytes')} B), max running requests "
                 f"{a.get('max_running_requests')}")
    if "host_kv_bytes" in a:
        line += f"; host pools {a['host_kv_bytes']} B KV + {a.get('host_mamba_bytes', 0)} B mamba per rank"
    if res.skipped:
        line += f"; not run: {res.skipped}"
    return line


def not_needed(prep: Prepared) -> str | None:
    """Why `up` skips the check: ``ESCHA_SGLANG_PREFLIGHT=0``, or no GPU requested (SGLang's
    attention-backend stage reads the GPU's platform; ``ESCHA_SGLANG_PREFLIGHT=1`` runs it anyway)."""
    switch = os.environ.get(PREFLIGHT_ENV)
    if switch == "0":
        return f"{PREFLIGHT_ENV}=0"
    if switch != "1" and not prep.args.get("device_requests"):
        return f"no GPUs requested: SGLang's stages read the GPU's platform ({PREFLIGHT_ENV}=1 runs it anyway)"
    return None


#: The throw-away container's entrypoint: SGLang's interpreter as ``serve`` picks it (the launch
#: argv's ``python3`` replaced by the image's ``$ESCHA_SGLANG_PYTHON``) runs the pre-flight's source.
ENTRYPOINT = ["/bin/sh", "-c", 'p="$1"; case "$p" in python*) p="${ESCHA_SGLANG_PYTHON:-$p}";; esac; '
              'exec "$p" -c "$2"', "sglang-preflight"]


def in_image(client, prep: Prepared, *, timeout_s: float = 300) -> PreflightResult:
    """``in_image_many`` for the launch's own argv with the plan's device figures."""
    argv = server_flags_of(list(prep.argv))
    return in_image_many(client, prep, [(argv, pf.device_figures(prep.plan))], timeout_s=timeout_s)[0]


def in_image_many(client, prep: Prepared, requests: list[tuple[list[str], dict[str, int] | None]], *,
                  timeout_s: float = 300) -> list[PreflightResult]:
    """Run the pre-flight in a throw-away container of ``prep``'s image (its GPUs, ipc,
    environment and data mounts; no memlock limit, as it pins nothing; no secret file, no
    network) for each ``(server flags, device figures)`` of ``requests`` in one SGLang process,
    and return SGLang's answers; a container that gives none is ``ok=None`` with its exit code
    and last line. `up` asks for its launch argv with the plan's figures (``in_image``). The
    pre-flight's code is this escha-deploy's ``sglang_preflight.py``, given as ``python -c``
    source: whatever escha-deploy the image carries, the stages are the ones this `up` planned
    with."""
    import time

    from . import docker as dk

    t0 = time.monotonic()
    argv = list(prep.argv)
    n = len(requests)
    args = {k: v for k, v in prep.args.items()
            if k in ("image", "device_requests", "ipc_mode", "shm_size", "security_opt", "init", "cap_add",
                     "cap_drop")}
    # the model folder and the other data mounts; no secret file, no spec file `up` has not written yet
    mounts = [m for m in prep.args.get("mounts", [])
              if m["target"] not in prep.spec.secret_files and os.path.exists(m["source"])]
    request = {"argvs": [list(a) for a, _ in requests], "devices": [d for _, d in requests]}
    env = {**prep.args.get("environment", {}), pf.REQUEST_ENV: json.dumps(request)}
    args.update(entrypoint=ENTRYPOINT, command=[argv[0], Path(pf.__file__).read_text()], environment=env,
                labels={**prep.args.get("labels", {}), dk.LABEL_MANAGED_BY: "escha-deploy-preflight"},
                network_mode="none", detach=True, mounts=mounts)
    ran = run_once(client, args, timeout_s)
    if isinstance(ran, str):
        return [PreflightResult(ok=None, not_run=ran, wall_s=0.0 if ran.startswith(NOT_CREATED)
                                else time.monotonic() - t0)] * n
    code, out, err = ran
    return pf.parse_answers(out, n, t0, f"the pre-flight container of {prep.spec.image} gave", code, err)


def check(client, prep: Prepared, *, dry: bool, report: Report = quiet, failed: Sequence[str] = ()) -> tuple[str, str]:
    """`up`'s ``sglang pre-flight`` check: ``(state, detail)``, or raises the refusal (exit 3).
    `up` (``dry`` False) reports the pre-flight's time and, once SGLang answered, has the
    server's ``serve --spec`` skip asking again. ``failed``: the checks before it that failed
    (the dry run goes on past them; `up` stops at the first): then it is not run, and says which."""
    image = prep.spec.image
    names = list(dict.fromkeys([*failed, *prep.refused_by]))
    if prep.image_present is False or names:
        why = ("which is not present" if prep.image_present is False else
               f"once the checks before it pass: {', '.join(names[:-1]) + ' and ' if names[1:] else ''}{names[-1]} failed")
        return "not run", f"it runs at `up`, in a container of {image}, {why}"
    # the container's deadline: 300 s, or ESCHA_SGLANG_PREFLIGHT_TIMEOUT where that is longer
    res = in_image(client, prep, timeout_s=max(300.0, pf.timeout_from_env()))
    if res.ok is None:
        if not dry:
            report("warning", f"up: SGLang's pre-flight did not run in {image}: {res.not_run}")
        return "not run", res.not_run
    if not res.ok:
        raise failure(res, prep.launch.profile_data, report)
    if not dry:
        report("info", f"up: SGLang's pre-flight {passed_line(res)}")
        prep.args["environment"] = {**prep.args.get("environment", {}), PREFLIGHT_ENV: "0"}
    return "ok", passed_line(res)


#: The two reasons ``run_once`` gives for a container that gave no answer.
NOT_CREATED, NOT_RUN = "its container could not be created", "its container did not run"


def run_once(client, args: dict, timeout_s: float) -> tuple[int, str, str] | str:
    """Create, start and wait for one throw-away container of ``args`` (docker-py ``create``
    arguments as ``launch.docker.to_docker`` takes them, without ulimits: it pins nothing), then
    remove it. Returns ``(exit code, stdout, stderr)``, or the reason it gave no answer (one line,
    at most 400 characters). Used by the image's SGLang pre-flight and by up's first-use check."""
    from docker.errors import DockerException
    from requests.exceptions import RequestException  # docker-py's transport: a read timeout is one

    from . import docker as dk

    no_answer = (DockerException, RequestException)
    try:
        c = client.containers.create(**dk.to_docker({**args, "ulimits": []}))
    except no_answer as exc:
        return f"{NOT_CREATED}: {exc}"[:400]
    try:
        c.start()
        code = c.wait(timeout=timeout_s)["StatusCode"]
        out = c.logs(stdout=True, stderr=False).decode(errors="replace")
        err = c.logs(stdout=False, stderr=True).decode(errors="replace")
    except no_answer as exc:
        return f"{NOT_RUN}: {exc}"[:400]
    finally:
        try:
            c.remove(force=True)
        except no_answer:
            pass  # the daemon removes nothing it did not answer for; the reason above stands
    return code, out, err
