"""``plan``'s mirrors of two model-runner checks, against the statements of each supported
release's wheel that make them, run here on the CPU.

SGLang makes both checks after the weights load, so no SGLang run here reaches them: the
constructors take the device pools (``TRTLLMHAAttnBackend``) or the loaded model's layers
(``PrefillCudaGraphRunner``, built by ``cuda_graph_setup.py: capture_prefill_graph``). The
statements themselves read only configuration, so each test compiles them out of the wheel's own
file (``ast``; the file's name and line numbers kept) and runs them on every input of a grid,
with stand-ins for what they read through SGLang's context accessors (``get_platform()``,
``get_parallel()``, ``get_schedule()``, ``get_exec()``) and for the model config, whose
``get_num_kv_heads`` is the wheel's own method:

- ``srt/arg_groups/overrides.py: _mla_backend_page_constraints`` (the page SGLang resolves for
  trtllm_mha), then ``srt/layers/attention/trtllm_mha_backend.py: TRTLLMHAAttnBackend.__init__``'s
  ``is_xqa_impl`` and its page-size check;
- ``srt/model_executor/runner/prefill_cuda_graph_runner.py: PrefillCudaGraphRunner.__init__``'s
  mixed-chunk assertion, with the release's ``Backend`` class (``cuda_graph_config.py``).

``plan`` must refuse exactly where those statements raise (``planner/validate.py:
model_runner_backend_problems``, ``mixed_chunk_prefill_graph_problem``).
"""

from __future__ import annotations

import ast
import itertools
import json
import logging
import types
import zipfile

import pytest

from escha_deploy.sglang import releases
from escha_deploy.sglang.arch import ModelArch, ModelDirFacts
from escha_deploy.sglang.flagcheck import load_catalog
from escha_deploy.planner.validate import mixed_chunk_prefill_graph_problem, model_runner_backend_problems
from tests.test_releases import _wheel

pytestmark = pytest.mark.wheel

RELEASES = releases.supported_releases()


def _source(version: str, path: str) -> tuple[str, ast.Module]:
    wheel = _wheel(version)
    with zipfile.ZipFile(wheel) as zf:
        src = zf.read(f"sglang/{path}").decode()
    return f"{wheel.name}/sglang/{path}", ast.parse(src)


def _find(tree: ast.AST, *qualname: str) -> ast.FunctionDef | ast.ClassDef:
    node: ast.AST = tree
    for name in qualname:
        node = next(n for n in ast.iter_child_nodes(node)
                    if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name == name)
    assert isinstance(node, (ast.FunctionDef, ast.ClassDef))
    return node


def _compiled(filename: str, nodes: list[ast.stmt]) -> types.CodeType:
    return compile(ast.Module(body=nodes, type_ignores=[]), filename, "exec")


def _function(filename: str, node: ast.FunctionDef, env: dict) -> types.FunctionType:
    """The wheel's function ``node``, its decorators left off, defined in ``env``."""
    node = ast.FunctionDef(**{**{f: getattr(node, f) for f in node._fields}, "decorator_list": []})
    ast.copy_location(node, node.body[0])
    exec(_compiled(filename, [ast.fix_missing_locations(node)]), env)
    return env[node.name]


class TrtllmMhaStatements:
    """One release's statements: the page snap, ``is_xqa_impl`` and the page-size check."""

    def __init__(self, version: str) -> None:
        ovr_file, ovr = _source(version, "srt/arg_groups/overrides.py")
        snap = _find(ovr, "_mla_backend_page_constraints")
        self.snap = _function(ovr_file, snap, {"logger": logging.getLogger("sglang-statements"), "Any": object})
        mc_file, mc = _source(version, "srt/configs/model_config.py")
        self.get_num_kv_heads = _function(mc_file, _find(mc, "ModelConfig", "get_num_kv_heads"), {})
        be_file, be = _source(version, "srt/layers/attention/trtllm_mha_backend.py")
        init = _find(be, "TRTLLMHAAttnBackend", "__init__")
        xqa = [s for s in init.body if isinstance(s, ast.Assign) and ast.unparse(s.targets[0]) == "self.is_xqa_impl"]
        check = [s for s in init.body if isinstance(s, ast.If) and "self.page_size >= 128" in ast.unparse(s.test)]
        assert len(xqa) == 1 and len(check) == 1, (version, "the statements moved: read the constructor again")
        self.code = _compiled(be_file, [*xqa, *check])

    def refuses(self, major: int, page: int, heads: int, kv_heads: int, tp: int, head_dim: int,
                v_head_dim: int) -> bool:
        view = types.SimpleNamespace(attention_backend="trtllm_mha", decode_attention_backend=None,
                                     prefill_attention_backend=None, speculative_draft_attention_backend=None,
                                     page_size=page)
        page = self.snap(view).get("page_size", page)
        config = types.SimpleNamespace(num_attention_heads=heads, head_dim=head_dim, v_head_dim=v_head_dim,
                                       is_draft_model=False, get_total_num_kv_heads=lambda: kv_heads)
        config.get_num_kv_heads = types.MethodType(self.get_num_kv_heads, config)
        platform = types.SimpleNamespace(is_sm90=major == 9, is_sm120=major == 12)
        env = {"self": types.SimpleNamespace(page_size=page), "config": config,
               "get_platform": lambda: platform,
               "get_parallel": lambda: types.SimpleNamespace(attn_tp_size=tp)}
        try:
            exec(self.code, env)
        except ValueError as exc:
            assert "trtllm_mha with page_size=" in str(exc), exc
            return True
        return False


def _plan_refuses(version: str, major: int, page: int, heads: int | None, kv_heads: int, tp: int, head_dim: int,
                  v_head_dim: int | None) -> tuple[bool, bool]:
    """(refused, warned) by ``plan``'s rule for a dense model of these heads on the card."""
    arch = ModelArch(model_type="llama", num_hidden_layers=2, num_key_value_heads=kv_heads, head_dim=head_dim)
    folder = ModelDirFacts(path="/m", num_attention_heads=heads, v_head_dim=v_head_dim)
    found = model_runner_backend_problems(releases.load_release(version), arch, "trtllm_mha", [], f"{major}.0",
                                          page_size=page, tp_size=tp, model_dir=folder)
    mine = [f for f in found if "trtllm_mha_backend.py: TRTLLMHAAttnBackend.__init__" in f[2]]
    assert len(mine) == len(found), found  # a dense model on these cards meets no other model-runner check
    return any(f[0] == "error" for f in mine), any(f[0] == "warning" for f in mine)


@pytest.mark.parametrize("version", RELEASES)
def test_trtllm_mha_page_rule_refuses_where_the_wheels_check_raises(version):
    """Every card major, page, head count, TP and head-dim pair: plan refuses exactly where the
    release's own statements raise, and knows the query heads from the model folder."""
    sglang = TrtllmMhaStatements(version)
    grid = itertools.product((8, 9, 10, 11, 12), (1, 8, 16, 64, 96, 128, 256), (2, 4, 8, 24, 64), (1, 2, 4, 8),
                             (1, 2, 4), (128, 256), (None, 128, 256))
    refused = 0
    for major, page, heads, kv, tp, head_dim, v in grid:
        want = sglang.refuses(major, page, heads, kv, tp, head_dim, v or head_dim)
        got, warned = _plan_refuses(version, major, page, heads, kv, tp, head_dim, v)
        assert (got, warned) == (want, False), (version, major, page, heads, kv, tp, head_dim, v)
        refused += want
    assert refused > 100, refused  # the grid reaches the check, on sm_100 and sm_110 only
    assert not sglang.refuses(12, 128, 4, 4, 1, 128, 128) and sglang.refuses(10, 128, 4, 4, 1, 128, 128)


@pytest.mark.parametrize("version", RELEASES)
def test_trtllm_mha_page_rule_without_the_model_folder_warns_where_the_heads_decide(version):
    """Without config.json the plan does not know the query heads: where SGLang's answer turns on
    them it warns (naming the head count below which SGLang refuses), and refuses nothing."""
    sglang = TrtllmMhaStatements(version)
    for major, page, kv, tp in itertools.product((9, 10, 12), (64, 128, 96), (1, 4, 8), (1, 2)):
        got, warned = _plan_refuses(version, major, page, None, kv, tp, 256, None)
        answers = {sglang.refuses(major, page, heads, kv, tp, 256, 256) for heads in (1, 2, 4, 8, 16, 32, 64, 128)}
        assert not got
        assert warned is (answers == {True, False}), (version, major, page, kv, tp, answers)


class MixedChunkStatement:
    """One release's ``PrefillCudaGraphRunner.__init__`` mixed-chunk assertion and ``Backend``."""

    def __init__(self, version: str) -> None:
        cfg_file, cfg = _source(version, "srt/model_executor/cuda_graph_config.py")
        env: dict = {}
        exec(_compiled(cfg_file, [_find(cfg, "Backend")]), env)
        self.backend = env["Backend"]
        run_file, run = _source(version, "srt/model_executor/runner/prefill_cuda_graph_runner.py")
        init = _find(run, "PrefillCudaGraphRunner", "__init__")
        stmt = [s for s in init.body if isinstance(s, ast.If) and "enable_mixed_chunk" in ast.unparse(s.test)]
        assert len(stmt) == 1, (version, "the statement moved: read the constructor again")
        self.code = _compiled(run_file, stmt)

    def refuses(self, mixed: bool, backend: str) -> bool:
        if backend == self.backend.DISABLED:
            return False  # cuda_graph_setup.py: capture_prefill_graph builds no prefill graph runner
        graph = types.SimpleNamespace(cuda_graph_config=types.SimpleNamespace(
            prefill=types.SimpleNamespace(backend=backend)))
        env = {"get_schedule": lambda: types.SimpleNamespace(enable_mixed_chunk=mixed),
               "get_exec": lambda: types.SimpleNamespace(graph=graph), "Backend": self.backend}
        try:
            exec(self.code, env)
        except AssertionError as exc:
            assert "Mixed chunk prefill requires" in str(exc), exc
            return True
        return False


def _prefill_backend_choices(version: str) -> list[str]:
    """--cuda-graph-backend-prefill's choices in the release's flag catalog (its parser's)."""
    return list(load_catalog(version).by_option["--cuda-graph-backend-prefill"].choices or ())


@pytest.mark.parametrize("version", RELEASES)
def test_mixed_chunk_rule_refuses_where_the_wheels_assertion_fails(version):
    """Each prefill graph backend the release's parser takes, with mixed chunk on and off, set by
    --cuda-graph-backend-prefill and by --cuda-graph-config: plan refuses exactly where the
    release's assertion fails (0.5.19: full and tc_piecewise; 0.5.23: none)."""
    sglang = MixedChunkStatement(version)
    release = releases.load_release(version)
    refused = set()
    for mixed, backend in itertools.product((True, False), _prefill_backend_choices(version)):
        want = sglang.refuses(mixed, backend)
        for extra in (["--cuda-graph-backend-prefill", backend], [f"--cuda-graph-backend-prefill={backend}"],
                      ["--cuda-graph-config", json.dumps({"prefill": {"backend": backend}})],
                      ["--cuda-graph-backend-prefill", "breakable", "--cuda-graph-config",
                       json.dumps({"prefill": {"backend": backend}})]):
            got = mixed_chunk_prefill_graph_problem(release, mixed, None, False, extra)
            assert (got is not None) == want, (version, mixed, extra, got)
        if want:
            refused.add(backend)
    pinned = {"0.5.19": {"full", "tc_piecewise"}, "0.5.23": set()}
    # a release added as data: what its facts.yaml says it takes, against the wheel's assertion above
    taken = set(release.mixed_chunk_prefill_graph.backends) if release.mixed_chunk_prefill_graph else set()
    assert refused == pinned.get(version, set(_prefill_backend_choices(version)) - taken - {"disabled"})


def test_mixed_chunk_rule_reads_the_backend_sglang_resolves():
    """cuda_graph_hook.py: parse_cuda_graph_config: --cuda-graph-config over
    --cuda-graph-backend-prefill over --disable-prefill-cuda-graph; an unset backend is SGLang's
    default (breakable), which takes mixed chunk; a speculative algorithm is left to SGLang."""
    release = releases.load_release("0.5.19")
    assert mixed_chunk_prefill_graph_problem(release, True, None, True, ["--cuda-graph-backend-prefill", "full"])
    assert not mixed_chunk_prefill_graph_problem(release, True, None, True, [])
    assert not mixed_chunk_prefill_graph_problem(release, True, None, False, [])
    assert not mixed_chunk_prefill_graph_problem(
        release, True, None, False,
        ["--cuda-graph-backend-prefill", "full", "--cuda-graph-config", '{"prefill": {"backend": "breakable"}}'])
    assert not mixed_chunk_prefill_graph_problem(
        release, True, None, False, ["--cuda-graph-backend-prefill", "full", "--speculative-algorithm", "EAGLE"])

