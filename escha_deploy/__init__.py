"""escha-deploy: a patched SGLang 0.5.19 + HiCache appliance for small multi-GPU boxes.

Layout: packages only (docs/ARCHITECTURE.md): the commands (``cli``, ``fleet``, ``watch``,
``bench``, ``doctor``, ``launch``) use the ``pipeline``, which plans with the pure ``planner`` on
``facts`` about the box, a ``profile`` of what is wanted and ``sglang`` as data, all on ``utils``.
Keep this module import-free: the CLI's cold start depends on it.
"""

__version__ = "0.1.0"

# The SGLang releases it plans for, and the default one, are data: escha_deploy/sglang/releases.py.
