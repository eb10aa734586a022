"""What the box is: the planner's inputs about the machine, and the readers that fill them.

The models are pure (no I/O): the host's memory (``facts.host.HostFacts``), its GPUs
(``facts.gpus``: NVML's inventory and which kernel builds run on which architecture), doctor's
findings (``facts.findings``), the facts file (``facts.file``), a box's runtime
(``facts.runtime``), ``bench``'s last measured prefill (``facts.prefill``) and where each fact
came from (``facts.provenance``).

The readers fill them: this machine (``facts.machine``: /proc, the cgroup files, the model
folder), NVML (``facts.nvml``), the folders a server needs (``facts.folders``), doctor's saved
findings and bench's last prefill (``facts.saved``), a facts file (``facts.factsfile``);
``facts.gpu_rules`` says what the GPU facts decide. This package never imports the request (the
pipeline, the planner) or the commands above it (``.importlinter``).
"""
