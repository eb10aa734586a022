"""Run in the flag-catalog venv (the real sglang 0.5.19 wheel): for each case, what SGLang's
launcher does before it starts any process: ``prepare_server_args(argv)``,
``ServerArgs.resolve_once()`` and ``ServerArgs.check_server_args()``
(``entrypoints/engine.py`` calls the last one; it holds the multi-node refusals of
``arg_groups/validation_hook.py``). The platform, the card and the model folder are answered
the way the oracle answers them (``scripts/sglang_oracle.py``, whose helpers this reuses).

    python sglang_check_nodes.py CASES.json OUT.json
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import logging
import sys
import tempfile
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _oracle():
    spec = importlib.util.spec_from_file_location("sglang_oracle", REPO / "scripts" / "sglang_oracle.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def check(so, case: dict, root: Path) -> dict:
    from sglang.srt.arg_groups.overrides import resolution_result
    from sglang.srt.runtime_context import override_platform
    from sglang.srt.server_args import prepare_server_args

    argv = so._with_model(case["argv"], so._model_dir(root, case))
    so._card(case)
    try:
        with override_platform(**so._platform_facts(case)), contextlib.redirect_stderr(io.StringIO()):
            sa = prepare_server_args(argv)
            sa.resolve_once()
            sa.check_server_args()
    except SystemExit as exc:
        return {"ok": False, "error": f"argparse exit {exc.code}"}
    except Exception as exc:
        where = traceback.extract_tb(exc.__traceback__)[-1]
        return {"ok": False, "error": " ".join(str(exc).split())[:400],
                "site": f"{Path(where.filename).as_posix().split('site-packages/')[-1]}:{where.name}"}
    names = ("tp_size", "pp_size", "nnodes", "node_rank", "dist_init_addr", "disable_overlap_schedule")
    return {"ok": True, **{n: resolution_result(sa, n) for n in names}}


def main() -> int:
    cases = json.loads(Path(sys.argv[1]).read_text())
    so = _oracle()
    out = {}
    with tempfile.TemporaryDirectory(prefix="escha-nodes-") as tmp:
        so.clean_environment(tmp)
        so.install_torchvision_stand_in()
        so.install_platform_plugin(Path(tmp))
        import sglang.srt.server_args  # noqa: F401

        logging.disable(logging.WARNING)
        so.answer_prefill_graph_backend()
        for case in cases:
            out[case["id"]] = check(so, case, Path(tmp))
    Path(sys.argv[2]).write_text(json.dumps(out, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
