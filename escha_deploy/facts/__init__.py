"""The planner's inputs about the machine, as pure models (no I/O): the host's memory
(``facts.host.HostFacts``), its GPUs (``facts.gpus``: NVML's inventory and which kernel builds
run on which architecture) and ``bench``'s last measured prefill (``facts.prefill``).

The modules that read the machine (``host``, ``nvml``, ``findings``, ``factsfile``, ``doctor``)
fill these models; the planner and ``gpu_facts`` read them. This package imports nothing above
it (``.importlinter``).
"""
