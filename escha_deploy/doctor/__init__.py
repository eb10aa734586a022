"""``doctor``: will this profile work on this box? Answered before a 10-minute model load.

Layout (one concern a module):

- ``report``: the report model (``Check`` with ok/warn/fail and a one-line fix, ``DoctorReport``).
- ``hostinfo``: host readers beyond ``escha_deploy.facts.machine`` (swap, page cache, hugepages, memlock
  ulimit, /dev/shm size, WSL2 signals), and ``docker info``: read through docker-py and
  classified (Docker Desktop or an engine, WSL2 kernel, GPU runtime).
- ``gpu``: the GPU inventory through NVML (nvidia-ml-py), else ``nvidia-smi``, else "no GPU"
  with the reasons.
- ``store_probe``, ``pinned_ceiling``, ``nccl_smoke``: the GPU probes. Each runs as its own
  process (``python -m escha_deploy.doctor.<name>``), because an illegal memory access or a
  failed pinned allocation poisons the CUDA context; ``probes`` drives them with timeouts.
- ``facts``: everything gathered, as one value; ``checks``: pure functions from it to rows.
- ``run``: gathers the facts, runs (or reuses) the probes, builds the report, saves findings.

docs/doctor.md has the checks, the probes and what was seen on a real GPU.

Keep this module import-free: the CLI's cold start depends on it.
"""
