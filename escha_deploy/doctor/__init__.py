"""``doctor``: will this profile work on this box? Answered before a 10-minute model load.

Layout (one concern a module):

- ``report``: the report model (``Check`` with ok/warn/fail and a one-line fix, ``DoctorReport``).
- ``hostinfo``: host readers beyond ``escha_deploy.host`` (swap, page cache, hugepages, memlock
  ulimit, /dev/shm size, WSL2 signals) and the classification of ``docker info``.
- ``dockercheck``: is the daemon reachable, which daemon is it, does it offer a GPU runtime.
- ``gpu``: the GPU inventory through NVML (nvidia-ml-py), else ``nvidia-smi``, else "no GPU"
  with the reasons.
- ``store_probe``, ``pinned_ceiling``, ``nccl_smoke``: the GPU probes. Each runs as its own
  process (``python -m escha_deploy.doctor.<name>``), because an illegal memory access or a
  failed pinned allocation poisons the CUDA context, and is driven with a timeout by
  ``probes``.
- ``checks``: pure functions from gathered facts to ``Check`` rows (tested as tables).
- ``run``: gathers the facts, runs the probes, builds the report, saves the findings.

Keep this module import-free: the CLI's cold start depends on it.
"""
