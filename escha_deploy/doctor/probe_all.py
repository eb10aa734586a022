"""Every GPU probe of this environment, as one JSON object: what ``up`` runs inside the
profile's image, since the container's limits (its cgroup, /dev/shm, memlock, the WSL2 pinned
ceiling as the container sees it) are what count.

Run as ``python -m escha_deploy.doctor.probe_all --target BYTES [--world-size N]
[--fresh-only]``. It gathers this environment's facts (``facts.gather_facts``), runs the store
probe, the pinned ladder up to ``--target`` (capped at MemAvailable minus 2 GiB) and, for
``--world-size`` >= 2, the all-reduce smoke test, each in its own process; then prints
``{"platform", "in_container", "gpus", "probes"}`` with ``probes`` a ``facts.ProbeFacts``.
The caller turns ``probes`` into findings with ``run.probe_findings(..., host_id=<the host's>)``.
Exit 0 once the probes ran (their verdicts are in the JSON), 3 when no GPU is visible.
"""

from __future__ import annotations

import argparse
import json
import sys


def main(argv: list[str] | None = None) -> int:
    from .checks import ProfileNeeds
    from .facts import gather_facts
    from .run import run_probes

    parser = argparse.ArgumentParser(prog="python -m escha_deploy.doctor.probe_all",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--target", type=int, required=True, help="bytes: the planned per-rank host pools")
    parser.add_argument("--world-size", type=int, default=1, help="GPUs for the all-reduce (the profile's tp_size)")
    args = parser.parse_args(argv)
    facts = gather_facts()
    need = ProfileNeeds(name="image", gpu_count=args.world_size, gpu_vram_bytes=0, gpu_name="", tp_size=args.world_size,
                        hicache_enabled=True, pinned_per_rank_bytes=args.target)
    probes = run_probes(facts, need, reuse=False)
    out = {"platform": facts.platform, "in_container": facts.in_container,
           "gpus": facts.gpus.model_dump(mode="json"), "probes": probes.model_dump(mode="json")}
    sys.stdout.write(json.dumps(out) + "\n")
    return 0 if facts.gpus.count else 3


if __name__ == "__main__":
    raise SystemExit(main())
