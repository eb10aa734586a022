"""TEST-ONLY: lets SGLang's pre-flight (escha_deploy/launch/sglang_preflight.py) run on a CI
machine that has no GPU, in the flag-catalog venv (SGLang 0.5.19 --no-deps, CPU torch 2.13).

Put on PYTHONPATH of SGLang's interpreter only in tests. It installs the oracle's stand-ins
(scripts/sglang_oracle.py, each named there): the torchvision stand-in, the test-only platform
plugin describing the card in ``$ESCHA_TEST_CARD`` (JSON: vram_bytes, name, capability), SGLang's
own ``override_platform`` switch set to that card's facts, and the prefill-graph backend answer
CUDA would give; and, for the model-runner stage, empty stand-in packages for what the flag-catalog
venv does not install and the attention backend modules import at their top (``MISSING``: einops,
the HTTP server's fastapi and uvicorn, the CUDA kernels of sgl_kernel; only where no real one is
found). Nothing else of SGLang is replaced; on a real GPU none of this is loaded.
"""

import atexit
import importlib.util
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path


#: Packages the attention backend modules import at their top that the flag-catalog venv lacks
#: (``layers/attention/triton_backend.py``: einops; ``flashattention_backend.py``: sgl_kernel;
#: ``hybrid_linear_attn_backend.py`` through ``managers/``: fastapi, uvicorn); stage 6 of the
#: pre-flight constructs none of what they provide (it stands in the backend classes).
MISSING = ("einops", "fastapi", "uvicorn", "sgl_kernel")


def _stand_in_missing(oracle) -> None:
    import importlib.abc
    import importlib.machinery

    absent = {name for name in MISSING if importlib.util.find_spec(name) is None}

    class _Missing(importlib.abc.MetaPathFinder, importlib.abc.Loader):
        def find_spec(self, name, path, target=None):
            if name.split(".")[0] in absent:
                return importlib.machinery.ModuleSpec(name, self, is_package=True)
            return None

        def create_module(self, spec):
            mod = oracle._StandInModule(spec.name)
            mod.__path__ = []
            mod.__file__ = "<escha test-only stand-in>"
            return mod

        def exec_module(self, module):
            pass

    sys.meta_path.append(_Missing())


def _install() -> None:
    _card = json.loads(os.environ["ESCHA_TEST_CARD"])
    _spec = importlib.util.spec_from_file_location("escha_sglang_oracle", os.environ["ESCHA_ORACLE_SCRIPT"])
    _oracle = importlib.util.module_from_spec(_spec)
    sys.modules["escha_sglang_oracle"] = _oracle
    _spec.loader.exec_module(_oracle)

    _tmp = tempfile.mkdtemp(prefix="escha-preflight-site-")
    # each interpreter of the pre-flight makes one: removed at its exit (235 were left in /tmp)
    atexit.register(shutil.rmtree, _tmp, ignore_errors=True)
    os.environ.setdefault("HOME", _tmp)
    os.environ["SGLANG_CACHE_DIR"] = os.path.join(_tmp, "sglang-cache")
    os.environ["SGLANG_PLATFORM"] = _oracle.PLUGIN_NAME
    os.environ["HF_HUB_OFFLINE"] = os.environ["TRANSFORMERS_OFFLINE"] = "1"
    _oracle.install_torchvision_stand_in()
    _stand_in_missing(_oracle)
    _oracle.install_platform_plugin(Path(_tmp))

    import sglang.srt.platforms  # noqa: E402,F401  (resolves the plugin: import it only after)
    from sglang.srt.runtime_context import override_platform  # noqa: E402

    import escha_oracle_platform as _plugin  # noqa: E402  (written by install_platform_plugin)

    _plugin.CARD.update(vram_bytes=int(_card["vram_bytes"]), name=_card["name"],
                        capability=tuple(int(x) for x in _card["capability"].split(".")))

    override_platform(**_oracle._platform_facts({"gpu": _card})).install()
    _oracle.answer_prefill_graph_backend()


# escha-deploy's own interpreter shares this PYTHONPATH in the tests: do nothing where there is no SGLang
if importlib.util.find_spec("sglang") is not None and "ESCHA_TEST_CARD" in os.environ:
    _install()
