"""SGLang's own pre-flight: before the server starts, SGLang's code answers for the argv it will run.

``serve`` (``--spec`` in the image, and native ``--profile``) runs this file as a script in SGLang's
own interpreter, with the environment the server gets, before the first weight loads. It runs
the stages SGLang's ``launch_server`` runs first, and stops at the first refusal:

1. **argument resolution**: ``srt/server_args.py: prepare_server_args(argv)`` then
   ``ServerArgs.resolve_once()`` (``launch_server.run_server`` does the same; the hooks under
   ``srt/arg_groups/`` run here, on this machine's platform);
2. **model config**: ``srt/configs/model_config.py: ModelConfig.from_server_args`` reads the model
   folder's config.json (the context-length refusal, the architecture's registry entry);
3. **attention backend**: what resolution chose for the model class on this GPU
   (``arg_groups/overrides.py``: ``attention_backend``, prefill and decode backends), reported.

No weights, no NCCL, no CUDA allocation. The device pools' and host pools' sizing are not run
here (``escha-deploy plan`` mirrors them, and CI checks that mirror against SGLang's own
``KVCacheConfigurator`` and host-pool classes).

Two halves in one file: ``main()`` is the SGLang side (it imports only the standard library and
``sglang``, since SGLang's interpreter has no escha_deploy); ``run()`` is the escha-deploy side,
which starts it and reads its one JSON answer. A refusal carries SGLang's message, its
``file:function``, the stage, and the argv flags it names or, when its message names none, the
flags the failing function reads.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

STAGES = ("argument resolution", "model config", "attention backend")

#: How long the pre-flight may take (importing SGLang takes 8-15 s on a 2-core machine).
TIMEOUT_S = 240.0

# --------------------------------------------------------------------------- SGLang's side


def _site(exc: BaseException) -> tuple[str, str]:
    """``(file under sglang/, function)`` of the innermost frame inside SGLang's server code
    (``sglang/srt/``), wherever the package is installed."""
    import traceback

    frames = [f for f in traceback.extract_tb(exc.__traceback__) if "/sglang/srt/" in f.filename.replace("\\", "/")]
    if not frames:
        frames = traceback.extract_tb(exc.__traceback__)[-1:]
    if not frames:
        return "?", "?"
    f = frames[-1]
    path = f.filename.replace("\\", "/")
    # the last /sglang/: an image keeps SGLang in /opt/sglang/venv/.../site-packages/sglang/
    path = path.rsplit("/sglang/", 1)[-1] if "/sglang/" in path else Path(path).name
    return path, f.name


def _stage_of(path: str, current: str) -> str:
    """The stage a refusal belongs to, from the SGLang file that raised it."""
    if path.startswith(("srt/configs/", "srt/utils/hf_transformers")):
        return "model config"
    if "attention" in path:
        return "attention backend"
    return current


def _flags_read(exc: BaseException, message: str, dest_flag: dict[str, str], argv: list[str]) -> list[str]:
    """The argv flags a refusal is about: those its message names (``--flag`` or the dest), else
    the ones the failing function's source reads (``x.dest``), keeping only flags in ``argv``."""
    given = {a.split("=", 1)[0] for a in argv if a.startswith("--")}
    named = [f for f in re.findall(r"--[a-z0-9][a-z0-9-]*", message) if f in given]
    named += [dest_flag[d] for d in re.findall(r"[a-z_][a-z0-9_]+", message) if d in dest_flag
              and dest_flag[d] in given]
    if not named:
        import inspect

        tb = exc.__traceback__
        while tb is not None and tb.tb_next is not None:
            tb = tb.tb_next
        try:
            src = inspect.getsource(tb.tb_frame.f_code) if tb is not None else ""
        except (OSError, TypeError):
            src = ""
        named = [dest_flag[d] for d in re.findall(r"\.([a-z_][a-z0-9_]+)", src) if d in dest_flag
                 and dest_flag[d] in given]
    return list(dict.fromkeys(named))


def sglang_side(argv: list[str]) -> dict[str, Any]:
    """Run the stages on ``argv`` (the flags after ``-m sglang.launch_server``) in this process.
    Returns the answer: ``ok``, ``stage`` reached, ``answers`` (what SGLang resolved) or the
    refusal (``type``, ``message``, ``site``, ``flags``), ``seconds`` per part."""
    import argparse
    import contextlib
    import io

    t0 = time.monotonic()
    try:
        from sglang.srt.server_args import ServerArgs, prepare_server_args
    except ImportError as exc:  # an SGLang without its dependencies (a build-only image)
        return {"ok": None, "not_run": f"sglang.srt.server_args does not import ({exc})"}

    seconds: dict[str, float] = {"import": round(time.monotonic() - t0, 3)}
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    dest_flag = {a.dest: a.option_strings[0] for a in parser._actions if a.option_strings}  # noqa: SLF001
    stage = STAGES[0]
    out: dict[str, Any] = {"ok": True, "stage": stage}
    t1 = time.monotonic()
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            sa = prepare_server_args(list(argv))
            sa.resolve_once()
        seconds["argument resolution"] = round(time.monotonic() - t1, 3)
        stage = "model config"
        t2 = time.monotonic()
        from sglang.srt.configs.model_config import ModelConfig

        mc = ModelConfig.from_server_args(sa)
        seconds["model config"] = round(time.monotonic() - t2, 3)
        stage = "attention backend"
        from sglang.srt.arg_groups.overrides import resolution_result

        answers = {name: resolution_result(sa, name) for name in (
            "attention_backend", "prefill_attention_backend", "decode_attention_backend", "mem_fraction_static",
            "page_size", "max_running_requests", "chunked_prefill_size", "mamba_radix_cache_strategy")}
        answers["context_length"] = getattr(mc, "context_len", None)
        answers["architecture"] = (getattr(mc.hf_config, "architectures", None) or [None])[0]
        out["stage"] = stage
        out["answers"] = {k: v if isinstance(v, (int, float, str, bool, type(None))) else str(v)
                          for k, v in answers.items()}
    except SystemExit as exc:  # argparse: its message is on stderr
        lines = [ln for ln in err.getvalue().splitlines() if ln.strip()]
        out.update(ok=False, stage=stage, type="SystemExit",
                   message=(lines[-1] if lines else f"argparse exit {exc.code}"), site="srt/server_args.py:prepare_server_args",
                   flags=[f for f in re.findall(r"--[a-z0-9][a-z0-9-]*", lines[-1] if lines else "")])
    except Exception as exc:  # SGLang refused: its type and message are the answer
        message = " ".join(str(exc).split()) or type(exc).__name__
        path, func = _site(exc)
        out.update(ok=False, stage=_stage_of(path, stage), type=type(exc).__name__, message=message[:1000],
                   site=f"{path}:{func}", flags=_flags_read(exc, message, dest_flag, list(argv)))
    seconds["total"] = round(time.monotonic() - t0, 3)
    out["seconds"] = seconds
    return out


def main() -> int:
    """Script entry (SGLang's interpreter): one JSON request on stdin (``{"argv": [...]}``, or
    ``{"argvs": [[...], ...]}`` for several in one process, as the tests run them), one JSON answer
    per argv on stdout, a line each. Exit 0 with any answer; 1 when the request is unreadable; 4
    when ``sglang`` cannot be imported (the answer says so)."""
    try:
        request = json.loads(sys.stdin.read())
        argvs = [request["argv"]] if "argv" in request else list(request["argvs"])
        argvs = [[str(a) for a in argv] for argv in argvs]
    except (ValueError, KeyError, TypeError) as exc:
        print(f"sglang pre-flight: bad request: {exc}", file=sys.stderr)
        return 1
    try:
        import sglang  # noqa: F401
    except ImportError as exc:
        print(json.dumps({"ok": None, "not_run": f"sglang does not import ({exc})"}))
        return 4
    for argv in argvs:
        print(json.dumps(sglang_side(argv)), flush=True)
    return 0


# --------------------------------------------------------------------------- escha-deploy's side


@dataclass(frozen=True)
class PreflightResult:
    """SGLang's answer. ``ok``: True passed, False refused, None not run (``not_run`` says why).
    ``seconds``: SGLang's import, each stage and the total, as measured inside its process;
    ``wall_s``: the whole pre-flight process as ``serve`` waited for it."""

    ok: bool | None
    stage: str = ""
    message: str = ""
    type: str = ""
    site: str = ""
    flags: list[str] = field(default_factory=list)
    answers: dict[str, Any] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    wall_s: float = 0.0
    not_run: str = ""


def server_flags_of(argv: list[str]) -> list[str]:
    """The flags after ``-m sglang.launch_server`` in a launch argv (the whole list when it has
    no ``-m``)."""
    if "-m" in argv:
        i = argv.index("-m")
        return list(argv[i + 2:])
    return list(argv)


def run(python: str, argv: list[str], env: dict[str, str] | None = None, *,
        timeout_s: float = TIMEOUT_S) -> PreflightResult:
    """Run the pre-flight for ``argv`` (the server's flags) with ``python`` (SGLang's interpreter)
    and ``env`` (the server's environment). Never raises for SGLang's answer; a pre-flight that
    could not run (no such interpreter, no sglang, a timeout, an unreadable answer) is
    ``ok=None`` with the reason."""
    return run_many(python, [argv], env, timeout_s=timeout_s)[0]


def run_many(python: str, argvs: list[list[str]], env: dict[str, str] | None = None, *,
             timeout_s: float = TIMEOUT_S) -> list[PreflightResult]:
    """``run`` for several argvs in one SGLang process (SGLang imported once): one result each."""
    t0 = time.monotonic()

    def not_run(why: str) -> list[PreflightResult]:
        return [PreflightResult(ok=None, not_run=why, wall_s=time.monotonic() - t0)] * len(argvs)

    try:
        proc = subprocess.run([python, str(Path(__file__).resolve())], input=json.dumps({"argvs": argvs}),
                              capture_output=True, text=True, env=env, timeout=timeout_s, check=False)
    except FileNotFoundError:
        return not_run(f"no interpreter {python}")
    except subprocess.TimeoutExpired:
        return not_run(f"it did not answer within {timeout_s:.0f} s")
    answers = []
    for line in proc.stdout.splitlines():
        if line.startswith("{"):
            try:
                answers.append(json.loads(line))
            except ValueError:
                pass
    if answers and answers[0].get("ok") is None:
        return not_run(str(answers[0].get("not_run", "not run")))
    if len(answers) != len(argvs):
        tail = " ".join(proc.stderr.strip().splitlines()[-1:])[:300]
        return not_run(f"{python} gave {len(answers)} of {len(argvs)} answers (exit {proc.returncode}"
                       f"{': ' + tail if tail else ''})")
    wall = time.monotonic() - t0
    return [PreflightResult(
        ok=bool(d["ok"]), stage=str(d.get("stage", "")), message=str(d.get("message", "")),
        type=str(d.get("type", "")), site=str(d.get("site", "")), flags=list(d.get("flags") or []),
        answers=dict(d.get("answers") or {}), seconds=dict(d.get("seconds") or {}), wall_s=wall) for d in answers]


def profile_keys_for(flags: list[str], extra_args: list[str]) -> list[str]:
    """Where each flag came from: ``runtime.extra_args item '--flag'`` when the profile's
    ``extra_args`` carries it, else the profile key whose ``SGLangFlag`` metadata names it, else
    ``the plan (--flag)`` for a value the planner computes (``--max-total-tokens`` ...)."""
    from escha_deploy.profile import Profile, sglang_flag

    by_flag: dict[str, str] = {}

    def walk(model: type, prefix: str) -> None:
        for name, info in model.model_fields.items():
            meta = sglang_flag(info)
            if meta is not None and meta.flag:
                by_flag.setdefault(meta.flag, prefix + name)
            ann = info.annotation
            if isinstance(ann, type) and hasattr(ann, "model_fields"):
                walk(ann, f"{prefix}{name}.")

    walk(Profile, "")
    given = {a.split("=", 1)[0] for a in extra_args if a.startswith("--")}
    out = []
    for f in flags:
        if f in given:
            out.append(f"runtime.extra_args item '{f}'")
        elif f in by_flag:
            out.append(by_flag[f])
        else:
            out.append(f"the plan ({f})")
    return list(dict.fromkeys(out))


def refusal_line(result: PreflightResult, keys: list[str]) -> str:
    """One line for a refusal: stage, SGLang's message, where it raised, what set the input."""
    where = f" ({result.site})" if result.site else ""
    set_by = f"; set by {', '.join(keys)}" if keys else ""
    return f"SGLang's pre-flight refused at {result.stage}: {result.type}: {result.message}{where}{set_by}"


if __name__ == "__main__":
    sys.exit(main())
