"""What `serve` checks where it runs: what the host could not see, against what the plan assumed.

Each check compares one thing the running environment can see with the ``LaunchSpec``:

- capabilities: ``/etc/escha/runtime.json`` (``runtime.description``) must provide every
  capability the plan assumed (``LaunchFacts.capabilities``);
- GPUs: the CUDA device nodes (``/dev/nvidia0``, ``/dev/nvidia1``, ...; ``/dev/dxg`` under WSL2,
  which cannot be counted) against ``LaunchNeeds.gpus``;
- memory: the memory this process can have (``HostFacts.memory_base``: MemTotal less huge pages,
  or the cgroup limit when lower) must not be below ``LaunchFacts.memory_base_bytes``;
- memlock: ``RLIMIT_MEMLOCK`` must allow the pinned pools of one rank, unless the process holds
  ``CAP_IPC_LOCK`` (mlock(2): then the limit does not apply);
- the model folder at ``LaunchNeeds.model_path``, and a speculative draft's at
  ``LaunchNeeds.draft_path``: present, with config.json and weights;
- the file L3 store at ``LaunchNeeds.l3_dir``: present, writable, free space plus the store's own
  files holding ``l3_max_bytes`` x ``l3_owner_ranks`` + ``l3_min_free_bytes`` (``folders.check_l3_dir``).

A disagreement refuses with exit 3, one line each with both numbers; a model folder without
config.json or weights (the model's or the draft's) is bad input (exit 2).
"""

from __future__ import annotations

import os
import resource
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from escha_deploy.pipeline.spec import LaunchNeeds, LaunchSpec

#: The documented test switch: `serve` skips its GPU check (so an image can be started on a
#: machine without a GPU and reach SGLang's child process). Never set in production.
SKIP_GPU_PREFLIGHT_ENV = "ESCHA_SKIP_GPU_PREFLIGHT"
#: CAP_IPC_LOCK's bit in /proc/self/status CapEff (linux/capability.h).
CAP_IPC_LOCK = 14


@dataclass
class Checked:
    """The outcome: ``bad_input`` (exit 2), ``refusals`` (exit 3), ``warnings`` (shown)."""

    bad_input: list[str] = field(default_factory=list)
    refusals: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def gpu_nodes(root: Path = Path("/")) -> tuple[int, bool]:
    """``(count, wsl2)``: the ``/dev/nvidiaN`` nodes here, and whether ``/dev/dxg`` (WSL2's GPU
    paravirtualisation device, one node for every GPU) exists."""
    dev = root / "dev"
    n = sum(1 for p in dev.glob("nvidia[0-9]*") if p.name[len("nvidia"):].isdigit())
    return n, (dev / "dxg").exists()


def has_cap_ipc_lock(root: Path = Path("/")) -> bool:
    """True when this process's effective capabilities include CAP_IPC_LOCK."""
    try:
        for line in (root / "proc/self/status").read_text().splitlines():
            if line.startswith("CapEff:"):
                return bool(int(line.split()[1], 16) >> CAP_IPC_LOCK & 1)
    except (OSError, ValueError, IndexError):
        pass
    return False


def mounted_model_problems(path: str, *, native: bool = False, section: str = "model") -> list[str]:
    """Problems with a model folder at ``path`` (bad input): ``folders.check_model_folder``,
    naming the key that gave the folder: ``SECTION.path`` in a container (where
    ``SECTION.host_dir`` is mounted), ``SECTION.host_dir`` natively (``native``: the server
    loads the host folder). ``section``: ``model``, or ``model.draft`` for a speculative
    draft's folder."""
    import errno

    from escha_deploy.facts.folders import check_model_folder as check
    from escha_deploy.utils.termtext import shown

    try:
        os.stat(path)
    except OSError as exc:  # a name past PATH_MAX or NAME_MAX, a loop of links: one line, no traceback
        if exc.errno not in (errno.ENOENT, errno.ENOTDIR):
            key = f"{section}.host_dir" if native else f"{section}.path"
            return [f"{key}: {shown(path, 80)} ({len(path):,} characters) cannot be used here: "
                    f"{exc.strerror or exc}"]
    if native:
        if not Path(path).is_dir():
            return [f"{section}.host_dir: {path} is not a folder here (natively serve loads {section}.host_dir; "
                    f"{section}.path is the folder as a container sees it)"]
        return check(path, f"{section}.host_dir")
    if not Path(path).is_dir():
        return [f"{section}.path: {path} is not a folder here (is {section}.host_dir mounted?)"]
    return check(path, f"{section}.path")


def check_l3(needs: LaunchNeeds) -> list[str]:
    """Refusals for the file L3 store the spec needs (``LaunchNeeds.l3_dir``, cap
    ``l3_max_bytes`` in bytes), as this environment sees it (``folders.check_l3_dir``); none
    when the plan has no file L3. The spec's ``env`` is never read back."""
    from escha_deploy.facts.folders import check_l3_dir

    if not needs.l3_dir:
        return []
    return check_l3_dir(needs.l3_dir, needs.l3_max_bytes, tp_size=needs.l3_tp_size, ranks=needs.l3_owner_ranks,
                        mla=needs.l3_rank_replicated, min_free=needs.l3_min_free_bytes)


def check_here(launch: LaunchSpec, capabilities: list[str] | None, *, where: str, gpus: bool = True,
               root: Path = Path("/"), environ: dict[str, str] | None = None) -> Checked:
    """Compare what this environment provides with what ``launch`` assumed (module docstring).

    ``capabilities``: the runtime's (``None``: a stock runtime); ``where`` names it in messages.
    ``gpus=False`` skips the GPU check (``serve --print`` on a machine without GPUs).
    """
    from escha_deploy.facts.machine import gather_host_facts
    from escha_deploy.utils.units import fmt_gib

    env = os.environ if environ is None else environ
    out = Checked()
    missing = [c for c in launch.facts.capabilities if c not in (capabilities or [])]
    out.refusals += [f"{where}: runtime lacks capability {c!r}, which the plan assumed" for c in missing]

    needs = launch.needs
    if gpus and needs.gpus and env.get(SKIP_GPU_PREFLIGHT_ENV) != "1":
        n, dxg = gpu_nodes(root)
        if not n and not dxg:
            out.refusals.append("GPUs: no CUDA GPU device here (/dev/nvidia0, /dev/dxg); "
                                f"the plan needs {needs.gpus} (runtime.tp_size)")
        elif n and n < needs.gpus:
            out.refusals.append(f"GPUs: {n} CUDA device(s) here (/dev/nvidia*), the plan needs {needs.gpus} "
                                "(runtime.tp_size)")

    here = gather_host_facts(use_findings=False, root=root)
    have, src, _ = here.memory_base()
    want = launch.facts.memory_base_bytes
    if have < want:
        out.refusals.append(
            f"memory: this environment can have {have:,} B ({fmt_gib(have)}: {src}), below the {want:,} B "
            f"({fmt_gib(want)}) the plan assumed; plan for this limit (`escha-deploy plan`) or raise it")

    pinned = needs.pinned_bytes_per_rank
    soft, _hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    if pinned and soft != resource.RLIM_INFINITY and soft < pinned and not has_cap_ipc_lock(root):
        out.refusals.append(
            f"memlock: RLIMIT_MEMLOCK is {soft:,} B ({fmt_gib(soft)}), below the {pinned:,} B ({fmt_gib(pinned)}) "
            "of pinned host pools per rank the plan assumed, and this process lacks CAP_IPC_LOCK; "
            "run with --ulimit memlock=-1 (escha-deploy up and compose.yaml set it)")

    from .docker import SERVE_MODE_ENV

    model = launch.profile_data.get("model") or {}
    # natively (not in the container `up` or compose made) the spec names the host folder itself;
    # SGLang loads a speculative draft (--speculative-draft-model-path) only after the target's weights
    for section, path, host_dir in (("model", needs.model_path, model.get("host_dir")),
                                    ("model.draft", needs.draft_path, (model.get("draft") or {}).get("host_dir"))):
        if path:
            native = env.get(SERVE_MODE_ENV) != "container" and path == host_dir
            out.bad_input += mounted_model_problems(path, native=native, section=section)
    out.refusals += check_l3(needs)
    out.refusals += toolkit_refusals(launch, env)
    if stale := stale_driver(launch):
        out.warnings.append(stale)
    return out


def stale_driver(launch: LaunchSpec) -> str | None:
    """A warning when the GPU records the launch was planned from (a facts file's, or NVML's
    when it was planned) name an NVIDIA driver other than the one NVML reports here now: facts
    older than a driver change are stale (what pins, registers and passes NCCL's transports can
    change with it). None when they agree or either side is unknown."""
    from escha_deploy.facts.machine import read_gpu_facts

    planned = sorted({g.driver_version for g in launch.facts.gpus if g.driver_version})
    if not planned:
        return None
    now = read_gpu_facts()
    if now is None or not now.driver_version or now.driver_version in planned:
        return None
    return (f"facts: the GPU facts this launch was planned from were read under NVIDIA driver {', '.join(planned)}, "
            f"and driver {now.driver_version} is loaded now: stale; run `escha-deploy doctor` again and plan "
            "from its facts")

def toolkit_refusals(launch: LaunchSpec, environ: Mapping[str, str]) -> list[str]:
    """The first-use toolkit check (``runtime.first_use.toolkit``) for the server this launch
    starts here: the nvcc its JIT would read (the launch's environment over this one's) against
    the planned GPUs' compute capabilities (the facts' GPU records); one ``first use:`` line per
    problem, none when no GPU's capability is known."""
    from escha_deploy.runtime import first_use

    archs = [g.compute_capability for g in launch.facts.gpus if g.compute_capability]
    if not archs:
        return []
    problems, _detail = first_use.toolkit(archs, {**environ, **launch.env})
    return [f"first use: {p}" for p in problems]
