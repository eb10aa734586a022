"""`up`'s ``first use`` check: what the server builds after "ready", checked before it starts.

Runs ``runtime/first_use.py`` (standard library only, given as ``python -c`` source, so the
check is this `up`'s whatever escha-deploy the image carries) in a throw-away container of the
profile's image with the launch's JIT cache volume and its environment (``launch_spec.
JIT_CACHE_ENV``): the cache folders must be writable there, and with an L3 storage backend
SGLang's HiCache hash extension must build (a C++ compiler, ``<openssl/sha.h>``, ``-lcrypto``)
in the volume, where the server finds it; with torch in the image SGLang's own loader builds
it there now, so the first long request does not; and the nvcc a JIT in the image would read
(CUDA_HOME, else PATH) must be new enough for the planned GPUs (``first_use.toolkit``). A missing part is `up`'s exit 3, one line
each, naming it.
"""

from __future__ import annotations

import json
from pathlib import Path

from escha_deploy.utils.errors import Refused
from escha_deploy.pipeline.spec import CONTAINER_JIT_CACHE

from .prepare import Prepared

#: The label naming the profile a first-use container checks (not the profile's own label: it
#: is not the profile's server, which `down`, `status` and `up`'s stale check look for).
FIRST_USE_OF = "io.escha.first-use-of"
#: The hint of a refusal.
HINT = ("build the image from Dockerfile.hicache (`escha-deploy build`), which installs g++ and libssl-dev, or "
        "install them in your image; `escha-deploy runtime verify --first-use` in the image checks the same")


def needs_l3(prep: Prepared) -> bool:
    """Whether the launch turns an L3 storage backend on (HiCache with ``--hicache-storage-backend``)."""
    hc = prep.plan.hicache
    return bool(hc.enabled and hc.storage_backend)


def in_image(client, prep: Prepared, *, volume: bool = True, timeout_s: float = 900) -> dict:
    """The first-use answer (``first_use.check``'s dict) from a throw-away container of
    ``prep``'s image: its environment and (``volume``) its JIT cache volume, no GPU, no
    network, no other mount, none of the launch's labels (it is not the profile's server);
    ``{"ok": None, "not_run": why}`` when the container gave no answer."""
    from escha_deploy.runtime import first_use

    from . import docker as dk
    from .image_preflight import ENTRYPOINT, run_once

    mounts = [m for m in prep.args.get("mounts", []) if m["target"] == CONTAINER_JIT_CACHE] if volume else []
    args = {k: v for k, v in prep.args.items() if k in ("image", "security_opt", "init", "cap_add", "cap_drop")}
    command = [prep.argv[0], Path(first_use.__file__).read_text()]
    env = {**prep.args.get("environment", {}), first_use.L3_ENV: "1" if needs_l3(prep) else "0"}
    archs = [g.compute_capability for g in prep.launch.facts.gpus if g.compute_capability]
    if archs:  # the toolkit a JIT in the image would read, against the planned GPUs
        env[first_use.ARCHS_ENV] = ",".join(archs)
    args.update(entrypoint=ENTRYPOINT, command=command, environment=env,
                labels={dk.LABEL_MANAGED_BY: "escha-deploy-first-use", FIRST_USE_OF: prep.profile.name},
                network_mode="none", detach=True, mounts=mounts, device_requests=[])
    ran = run_once(client, args, timeout_s)
    if isinstance(ran, str):
        return {"ok": None, "not_run": ran}
    code, out, err = ran
    for line in reversed(out.splitlines()):
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                break
    last = (err.strip().splitlines() or ["no output"])[-1]
    return {"ok": None, "not_run": f"the container of {prep.spec.image} gave no answer (exit {code}): {last}"[:400]}


def check(client, prep: Prepared, *, dry: bool) -> tuple[str, str]:
    """`up`'s ``first use`` check: ``(state, detail)``, or raises ``Refused`` (exit 3) naming
    every missing part. Not run when the image is not here."""
    if prep.image_present is False:
        return "not run", f"it runs at `up`, in a container of {prep.spec.image}, which is not present"
    # the dry run makes no volume: it checks the image's own cache folders; `up` checks in the volume
    res = in_image(client, prep, volume=not dry)
    if res.get("ok") is None:
        return "not run", str(res.get("not_run"))
    problems = [p for row in res["checks"] for p in row["problems"]]
    if problems:
        raise Refused(*[f"first use: {p}" for p in problems], hint=HINT)
    where = "" if not dry else " (in the image's own folders: `up` checks in the launch's JIT cache volume)"
    return "ok", "; ".join(f"{row['name']}: {row['detail']}" for row in res["checks"]) + where
