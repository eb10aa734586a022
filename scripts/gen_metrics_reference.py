#!/usr/bin/env python3
"""Write the TP 2 ``/metrics`` reference exposition of an SGLang release, built on the CPU from
SGLang's own collector classes in its wheel, into ``tests/watch/fixtures/metrics-reference/``.

No GPU can run a TP 2 server here, so the exposition is made the way the server makes it:

- three processes share one ``PROMETHEUS_MULTIPROC_DIR`` (``utils/common.py:
  set_prometheus_multiproc_dir``): the tokenizer manager (``TokenizerMetricsCollector``) and two
  scheduler ranks, each with its ``SchedulerMetricsCollector`` (made by SGLang's
  ``SchedulerMetricsCollector.init_new``, which sets the labels and says whether this rank
  logs: only attention-TP rank 0 unless ``--enable-metrics-for-all-schedulers``) and its radix
  cache's ``RadixCacheMetricsCollector`` (labels from SGLang's own
  ``BasePrefixCache.init_metrics_collector``, run from the wheel's source, on a cache class named
  ``UnifiedRadixCache`` as a hybrid model's HiCache server has);
- each process drives its collectors through SGLang's methods (``log_stats``,
  ``increment_load_back_num_tokens``, ``observe_one_finished_request``, ...) with HiCache on;
- the parent exports the directory through ``prometheus_client.multiprocess.MultiProcessCollector``
  and ``generate_latest``, as the ``/metrics`` route does (``utils/common.py:
  add_prometheus_middleware``).

The collector module is loaded from the wheel itself, file by file; its heavy imports are
replaced by named stand-ins (``STAND_INS`` below: torch-importing modules and the runtime's
configuration context), and every configuration value the collectors read from a stand-in is
None (off) unless ``CONFIG`` sets it; the names read are written in the fixture's header.

    python scripts/gen_metrics_reference.py --wheel sglang-0.5.19-...whl          # write
    python scripts/gen_metrics_reference.py --wheel sglang-0.5.19-...whl --check  # exit 1 if stale
"""

from __future__ import annotations

import argparse
import ast
import enum
import importlib.machinery
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import types
import zipfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
OUT_DIR = REPO / "tests" / "watch" / "fixtures" / "metrics-reference"
TP = 2
MODEL = "/models/tiny-hybrid"

#: Files taken from the wheel as they are.
REAL_FILES = ("sglang/srt/observability/metrics_collector.py", "sglang/srt/observability/utils.py",
              "sglang/srt/observability/scheduler_stage_metrics.py", "sglang/srt/utils/gauge_histogram.py",
              "sglang/srt/mem_cache/base_prefix_cache.py", "sglang/srt/server_args.py")  # + arg_groups/fields/

#: Modules replaced by stand-ins, and why (each imports torch or needs a running server).
STAND_INS = {
    "sglang.srt.disaggregation.utils": "DisaggregationMode.to_engine_type -> 'unified' (no PD)",
    "sglang.srt.model_executor.forward_batch_info": "ForwardMode (imports torch)",
    "sglang.srt.runtime_context": "the server's configuration namespaces: CONFIG, else the field's"
                                  " default in the wheel's server_args.py (read with ast), else None",
    "sglang.srt.server_args": "ServerArgs (a type annotation here; imports torch)",
    "sglang.srt.utils": "get_bool_env_var (the package imports torch)",
    "sglang.srt.utils.nvtx_utils": "no-op NVTX ranges (imports torch)",
    "sglang.srt.layers.dp_attention": "is_dp_attention_enabled -> False (TP only)",
    "msgspec": "Struct, only when msgspec is not installed (a base class for DP stats)",
}

#: Configuration the collectors read, as a TP 2 HiCache server with ``--enable-metrics`` has it.
CONFIG = {
    "observability": {"enable_metrics": True, "enable_metrics_for_all_schedulers": False},
    "serving": {"served_model_name": MODEL, "enable_streaming_session": False},
    "disagg": {"disaggregation_mode": "null", "enable_pd_role_switch": False},
    "schedule": {"enable_priority_scheduling": False},
}


def server_args_defaults(root: Path) -> dict[str, Any]:
    """The server arguments' literal field defaults (``name: A[...] = <literal>``), read from
    ``server_args.py`` and, where a release splits them out (0.5.23), ``arg_groups/fields/*.py``."""
    files = [root / "sglang/srt/server_args.py", *sorted((root / "sglang/srt/arg_groups/fields").glob("*.py"))]
    out: dict[str, Any] = {}
    for f in files:
        for cls in (n for n in ast.parse(f.read_text(encoding="utf-8")).body if isinstance(n, ast.ClassDef)):
            for node in cls.body:
                if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                        and node.value is not None):
                    try:
                        out.setdefault(node.target.id, ast.literal_eval(node.value))
                    except ValueError:
                        continue
    return out


class _Config:
    """One configuration namespace: CONFIG's values, else ServerArgs' default, else None."""

    read: set[str] = set()
    defaults: dict[str, Any] = {}

    def __init__(self, space: str) -> None:
        self._space = space

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        _Config.read.add(f"{self._space}.{name}")
        space = CONFIG.get(self._space, {})
        return space[name] if name in space else _Config.defaults.get(name)


class _Parallel:
    def __init__(self, rank: int) -> None:
        self.tp_rank = self.attn_tp_rank = rank
        self.pp_rank = self.moe_ep_rank = self.attn_cp_rank = self.attn_dp_rank = 0
        self.tp_size = TP

    def __getattr__(self, name: str) -> Any:
        _Config.read.add(f"parallel.{name}")
        return 0


def _module(name: str, **attrs: Any) -> types.ModuleType:
    m = types.ModuleType(name)
    m.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
    m.__path__ = []  # type: ignore[attr-defined]
    m.__dict__.update(attrs)
    sys.modules[name] = m
    return m


def _install_stand_ins(root: Path, rank: int) -> None:
    _Config.defaults = server_args_defaults(root)
    for pkg in ("sglang", "sglang.srt", "sglang.srt.observability", "sglang.srt.mem_cache",
                "sglang.srt.layers", "sglang.srt.disaggregation", "sglang.srt.model_executor"):
        _module(pkg).__path__ = [str(root / pkg.replace(".", "/"))]  # type: ignore[attr-defined]

    class DisaggregationMode(enum.Enum):
        NULL = "null"

        @staticmethod
        def to_engine_type(mode: Any) -> str:
            return "unified"

    class ForwardMode(enum.IntEnum):
        EXTEND = 1

        def is_extend(self) -> bool:
            return self == ForwardMode.EXTEND

    _module("sglang.srt.disaggregation.utils", DisaggregationMode=DisaggregationMode)
    _module("sglang.srt.model_executor.forward_batch_info", ForwardMode=ForwardMode)
    _module("sglang.srt.server_args", ServerArgs=object)
    parallel = _Parallel(rank)
    ctx = types.SimpleNamespace(is_config_namespace_published=lambda space: False)
    _module("sglang.srt.runtime_context", get_context=lambda: ctx,
            get_observability=lambda: _Config("observability"), get_serving=lambda: _Config("serving"),
            get_disagg=lambda: _Config("disagg"), get_schedule=lambda: _Config("schedule"),
            get_parallel=lambda: parallel, exports_expert_balancedness_to_prometheus=lambda: False)
    utils = _module("sglang.srt.utils", get_bool_env_var=lambda name, default="false":
                    os.environ.get(name, default).lower() in ("true", "1"))
    utils.__path__ = [str(root / "sglang/srt/utils")]  # type: ignore[attr-defined]

    class _Nvtx:
        def __getattr__(self, name: str) -> Any:
            return lambda *a, **k: (a[0] if a and callable(a[0]) else (lambda f: f))

    nv = _Nvtx()
    sys.modules["sglang.srt.utils.nvtx_utils"] = types.ModuleType("sglang.srt.utils.nvtx_utils")
    sys.modules["sglang.srt.utils.nvtx_utils"].__getattr__ = nv.__getattr__  # type: ignore[attr-defined]
    _module("sglang.srt.layers.dp_attention", is_dp_attention_enabled=lambda: False)
    if importlib.util.find_spec("msgspec") is None:
        class Struct:
            def __init_subclass__(cls, **kw: Any) -> None:
                pass

        _module("msgspec", Struct=Struct)


def _load(root: Path, name: str) -> types.ModuleType:
    path = root / (name.replace(".", "/") + ".py")
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def _radix_collector(root: Path, mc: types.ModuleType) -> Any:
    """SGLang's own ``BasePrefixCache.init_metrics_collector`` (from the wheel's source, its
    module's other imports left out) run on a cache named ``UnifiedRadixCache``."""
    src = (root / "sglang/srt/mem_cache/base_prefix_cache.py").read_text(encoding="utf-8")
    tree = ast.parse(src)
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "BasePrefixCache")
    fn = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "init_metrics_collector")
    ns = dict(vars(mc))
    exec(compile(ast.Module(body=[fn], type_ignores=[]), "base_prefix_cache.py", "exec"), ns)

    class UnifiedRadixCache:
        init_metrics_collector = ns["init_metrics_collector"]

    cache = UnifiedRadixCache()
    cache.init_metrics_collector()  # type: ignore[attr-defined]
    return cache.metrics_collector  # type: ignore[attr-defined]


def worker(root: Path, role: str, rank: int) -> None:
    """One process: the tokenizer manager (role ``tokenizer``) or scheduler rank ``rank``."""
    _install_stand_ins(root, rank)
    mc = _load(root, "sglang.srt.observability.metrics_collector")
    if role == "tokenizer":
        labels = {"model_name": MODEL, "engine_type": "unified"}
        tok = mc.TokenizerMetricsCollector(server_args=None, labels=labels)
        for details in ({"device": 0, "host": 0}, {"device": 480, "host": 0}, {"device": 0, "host": 960}):
            cached = sum(details.values())
            tok.observe_one_finished_request(labels, 1000, 8, cached, 0.2, False,
                                             cached_tokens_details=details if cached else None)
    else:
        import inspect

        kw: dict[str, Any] = dict(server_args=None, enable_priority_scheduling=False, enable_lora=False,
                                  enable_hierarchical_cache=True)
        if "ps" in inspect.signature(mc.SchedulerMetricsCollector.init_new).parameters:  # 0.5.19
            kw.update(ps=_Parallel(rank), tp_rank=rank, pp_rank=0, dp_rank=None)
        ctx = mc.SchedulerMetricsCollector.init_new(**kw)
        if ctx.current_scheduler_metrics_enabled:  # the scheduler logs only then
            stats = mc.SchedulerStats(num_running_reqs=mc.QueueCount(total=1), token_usage=0.5, mamba_usage=0.25,
                                      hicache_host_used_tokens=960, hicache_host_total_tokens=4097)
            ctx.collector.log_stats(stats)
        radix = _radix_collector(root, mc)
        for pool in ("kv", "mamba"):  # unified_radix_cache.py seeds the drop counters at 0
            radix.increment_dropped_tokens(0, "host_pressure", pool)
        radix.increment_eviction_num_tokens(1000)
        radix.observe_eviction_duration(0.002)
        radix.increment_backup_num_tokens(1000, "kv")
        radix.increment_backup_num_tokens(1, "mamba")
        radix.increment_backup_num_bytes(2_000_000)
        radix.observe_backup_duration(0.001)
        radix.increment_load_back_num_tokens(960, "kv")
        radix.increment_load_back_num_tokens(1, "mamba")
        radix.increment_load_back_num_bytes(2_500_000)
        radix.observe_load_back_duration(0.0005)
    print(json.dumps({"read": sorted(_Config.read), "pid": os.getpid()}))


def build(wheel: Path) -> str:
    """The reference exposition of ``wheel``'s release, with its provenance header."""
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.multiprocess import MultiProcessCollector

    version = wheel.name.split("-")[1]
    read: set[str] = set()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "src"
        with zipfile.ZipFile(wheel) as z:
            fields = [f for f in z.namelist() if f.startswith("sglang/srt/arg_groups/fields/") and f.endswith(".py")]
            for f in (*REAL_FILES, *fields):
                if f in z.namelist():
                    (root / f).parent.mkdir(parents=True, exist_ok=True)
                    (root / f).write_bytes(z.read(f))
        prom = Path(tmp) / "prom"
        prom.mkdir()
        env = dict(os.environ, PROMETHEUS_MULTIPROC_DIR=str(prom), PYTHONPATH="")
        pids: dict[str, str] = {}
        for role, rank in (("tokenizer", 0), *(("scheduler", r) for r in range(TP))):
            p = subprocess.run([sys.executable, __file__, "--worker", role, str(rank), str(root)],
                               env=env, capture_output=True, text=True, check=False)
            if p.returncode != 0:
                raise SystemExit(f"{wheel.name}: the {role} {rank} process failed:\n{p.stderr[-3000:]}")
            got = json.loads(p.stdout.strip().splitlines()[-1])
            read |= set(got["read"])
            pids[str(got["pid"])] = role if role == "tokenizer" else f"{role}-{rank}"
        registry = CollectorRegistry()
        MultiProcessCollector(registry, path=str(prom))
        text = generate_latest(registry).decode()
    for pid, role in pids.items():  # gauges in multiprocess mode "all" keep the writer's pid
        text = text.replace(f'pid="{pid}"', f'pid="{role}"')
    header = [
        f"# SGLang {version} /metrics at TP {TP}, HiCache on, a hybrid model (UnifiedRadixCache): built on",
        "# the CPU by scripts/gen_metrics_reference.py from the wheel's collector classes in 3 processes",
        "# (tokenizer, scheduler ranks 0 and 1) sharing one PROMETHEUS_MULTIPROC_DIR, exported by",
        "# prometheus_client.multiprocess.MultiProcessCollector as SGLang's /metrics route does.",
        f"# Stand-ins: {', '.join(sorted(STAND_INS))}.",
        f"# Configuration read (CONFIG, else ServerArgs' default, else None): {', '.join(sorted(read))}.",
        "# Values are the script's, not a workload's; a pid label's value is the process's role here",
        "# (its process id on a server); what the test compares is each family's type and label names.",
    ]
    return "\n".join(header) + "\n" + _sorted_exposition(text)


def _sorted_exposition(text: str) -> str:
    """Families in name order, samples in text order (the multiprocess export's order follows
    the files it reads, which is not stable)."""
    blocks: dict[str, list[str]] = {}
    cur = ""
    for line in text.splitlines():
        if line.startswith("# HELP "):
            cur = line.split()[2]
        blocks.setdefault(cur, []).append(line)
    return "".join("\n".join([*b[:2], *sorted(b[2:])]) + "\n" for _, b in sorted(blocks.items()))


def out_path(wheel: Path) -> Path:
    return OUT_DIR / f"sglang-{wheel.name.split('-')[1]}-tp{TP}.txt"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--worker"]:
        worker(Path(argv[3]), argv[1], int(argv[2]))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--wheel", type=Path, default=os.environ.get("ESCHA_SGLANG_WHEEL"), required=False)
    ap.add_argument("--check", action="store_true", help="exit 1 when the committed file differs")
    a = ap.parse_args(argv)
    if a.wheel is None or not Path(a.wheel).is_file():
        print(f"--wheel: no such file: {a.wheel}", file=sys.stderr)
        return 2
    text = build(Path(a.wheel))
    path = out_path(Path(a.wheel))
    if a.check:
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            print(f"{path.relative_to(REPO)}: stale; run scripts/gen_metrics_reference.py --wheel {a.wheel}",
                  file=sys.stderr)
            return 1
        return 0
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    print(path.relative_to(REPO))
    return 0


if __name__ == "__main__":
    sys.exit(main())
