"""escha-deploy: a patched SGLang 0.5.19 + HiCache appliance for small multi-GPU boxes.

Layout: pure core (``profile``, ``arch``, ``planner``, ``launch_spec``)
and I/O at the edges (``host``, ``launch``, ``runtime``, ``doctor``, ``bench``, ``cli``).
Keep this module import-free: the CLI's cold start depends on it.
"""

__version__ = "0.1.0"

# The SGLang releases it plans for, and the default one, are data: escha_deploy/releases.py.
