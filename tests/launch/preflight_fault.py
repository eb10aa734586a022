"""TEST-ONLY: runs escha-deploy's SGLang pre-flight script (``sys.argv[1]``, as ``serve`` and
``sglang_preflight.run_many`` start it: ``PYTHON .../sglang_preflight.py``) with one of the
pre-flight's own helper functions replaced by one that raises: a planted fault of the harness.

``$ESCHA_TEST_PREFLIGHT_FAULT`` names the module-level function to replace (``_sized``,
``_host_pool_inputs`` ...); the replacement raises ``KeyError('planted harness fault')`` when
called. Everything else is the pre-flight as shipped: the script is loaded as a module, the one
name rebound, and its ``main()`` run. Started through a two-line shell wrapper that the tests
write (``ESCHA_SGLANG_PYTHON``), in a flag-catalog venv's interpreter.
"""

import importlib.util
import os
import sys

spec = importlib.util.spec_from_file_location("escha_preflight_planted", sys.argv[1])
module = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = module  # its dataclasses look their module up there
spec.loader.exec_module(module)
name = os.environ["ESCHA_TEST_PREFLIGHT_FAULT"]
if not callable(getattr(module, name, None)):
    raise SystemExit(f"preflight_fault.py: the pre-flight has no function {name!r} to plant a fault in")


def planted(*args, **kwargs):
    raise KeyError("planted harness fault")


setattr(module, name, planted)
sys.exit(module.main())
