"""The fuzz's SGLang side: many pre-flights in one SGLang process, each on its own card.

Run as a script in a flag-catalog venv's interpreter (SGLang 0.5.19 or 0.5.23) with the
test-only site hook of tests/launch/preflight_cpu_site on ``PYTHONPATH``. One JSON request on
stdin, ``{"cases": [{"argv": [...], "card": {"vram_bytes", "name", "capability"}, "env": {...},
"device": {...} | null}, ...]}`` (``env``: the ``SGLANG_*`` variables ``serve`` gives the server,
set for that case only; ``device``: the plan's sizing figures, bytes, as the pre-flight's request
carries them); one JSON answer per case on stdout, a line each, exactly what
``escha_deploy.launch.sglang_preflight.sglang_side`` answers for that argv and device (the
pre-flight's own SGLang half: argument resolution, model config, attention-backend choice and,
with ``device``, the KV cache configurator's and the host pools' sizing).

Two things differ from one ``serve`` pre-flight per case, both only to share one import:

- the card: before each case the site hook's platform plugin is told that case's card, and
  SGLang's own ``runtime_context.override_platform`` switch is entered with its facts (as
  ``scripts/sglang_oracle.py`` does per case); the probes SGLang caches are cleared;
- the parser: every ``prepare_server_args`` (and the pre-flight's own flag map) builds a fresh
  parser from ``ServerArgs``'s annotations (``ServerArgs.add_cli_args``), most of a case's
  time. Here it is built once, by SGLang's own ``add_cli_args``, and each later call gets a
  copy of each of its actions (its default deep-copied, so no case sees another's lists);
  the parser has no argument groups or parser defaults beyond its actions, so a copy parses
  as the original. ``typing.get_type_hints`` as ``srt/arg_groups/arg_utils.py`` calls it is
  memoized per class. Every ``CHECK_EVERY``-th case is answered a second time with SGLang's
  own ``add_cli_args`` and unmemoized hints; a differing answer is a harness failure (the
  case's answer then says ``"harness"``, and the test fails on it);
- the collector: the objects alive once SGLang is imported are frozen (``gc.freeze``), so the
  ``gc.collect()`` of the KV cache stage walks only each case's own.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import sys
from collections.abc import Callable


#: Every this many cases (the first included), the answer is checked against SGLang's own parser.
CHECK_EVERY = 50


def _shared_parser() -> tuple[Callable[[], None], Callable[[], None]]:
    """``(share, unshare)``: install and remove the built-once parser and memoized hints."""
    import argparse
    import copy

    from sglang.srt.arg_groups import arg_utils
    from sglang.srt.server_args import ServerArgs

    real_hints, real_add = arg_utils.get_type_hints, ServerArgs.add_cli_args

    @functools.cache
    def cached_hints(cls, include_extras=False):
        return real_hints(cls, include_extras=include_extras)

    template = argparse.ArgumentParser(prog="sglang serve")
    arg_utils.get_type_hints = cached_hints
    real_add(template)
    actions = [a for a in template._actions if "-h" not in a.option_strings]  # noqa: SLF001
    # a default deepcopy gives back as itself (None, a number, a string, a tuple of them) is
    # shared as deepcopy would share it; the others (lists, dicts) are copied for each parser
    mutable = [copy.deepcopy(a.default) is not a.default for a in actions]

    def add_cli_args(parser):
        for action, copied in zip(actions, mutable):
            mine = object.__new__(type(action))  # copy.copy's result for an Action (its __dict__, shallow)
            mine.__dict__.update(action.__dict__)
            if copied:
                mine.default = copy.deepcopy(action.default)
            parser._add_action(mine)  # noqa: SLF001

    # SGLang 0.5.23 reads a msgspec Struct's fields (``msgspec.structs.fields``, which evaluates
    # its annotations again each call) in every resolution step (``arg_utils.record_fields``)
    try:
        import msgspec.structs as structs
    except ImportError:
        structs = None
    real_fields = structs.fields if structs is not None else None
    fields_of_type = functools.cache(real_fields) if real_fields is not None else None

    def cached_fields(type_or_instance):  # kept per class; an instance (not hashable) is read again
        if isinstance(type_or_instance, type):
            return fields_of_type(type_or_instance)
        return real_fields(type_or_instance)

    def share() -> None:
        arg_utils.get_type_hints = cached_hints
        ServerArgs.add_cli_args = staticmethod(add_cli_args)
        if structs is not None:
            structs.fields = cached_fields

    def unshare() -> None:
        arg_utils.get_type_hints = real_hints
        ServerArgs.add_cli_args = staticmethod(real_add)
        if structs is not None:
            structs.fields = real_fields

    return share, unshare


def _same(a: dict, b: dict) -> bool:
    return {k: v for k, v in a.items() if k != "seconds"} == {k: v for k, v in b.items() if k != "seconds"}


def _import_first() -> None:
    """Import what every case runs before the request is read, so the import overlaps the
    planning of the cases in the test's own process."""
    import importlib

    for name in ("sglang.srt.server_args", "sglang.srt.arg_groups.pipeline", "sglang.srt.configs.model_config",
                 "sglang.srt.arg_groups.overrides", "sglang.srt.model_loader"):
        with contextlib.suppress(ImportError):
            importlib.import_module(name)


def main() -> int:
    import escha_oracle_platform  # noqa: F401  (the site hook wrote and installed it)
    import escha_sglang_oracle as oracle  # the site hook loaded scripts/sglang_oracle.py under this name
    from escha_deploy.launch.sglang_preflight import sglang_side
    from sglang.srt.runtime_context import override_platform

    _import_first()
    share, unshare = _shared_parser()
    # The KV cache stage's _profile_available_bytes runs gc.collect() before it reads free GPU
    # memory (the plan's figure here): with SGLang's modules frozen out of the collector, it
    # walks only what the cases made (about 290 ms a case less; what it frees is the same).
    import gc

    gc.collect()
    gc.freeze()
    request = json.loads(sys.stdin.read())
    for i, case in enumerate(request["cases"]):
        card = {"gpu": case["card"]}
        argv = [str(a) for a in case["argv"]]
        env = {str(k): str(v) for k, v in (case.get("env") or {}).items()}
        device = case.get("device")

        def answer() -> dict:
            oracle._card(card)  # noqa: SLF001
            saved = {k: os.environ.get(k) for k in env}
            os.environ.update(env)  # the SGLANG_* variables serve gives the server for this case
            try:
                with override_platform(**oracle._platform_facts(card)), contextlib.redirect_stdout(sys.stderr):  # noqa: SLF001
                    return sglang_side(argv, device)
            finally:
                for k, v in saved.items():
                    if v is None:
                        os.environ.pop(k, None)
                    else:
                        os.environ[k] = v

        share()
        got = answer()
        if i % CHECK_EVERY == 0:
            unshare()
            own = answer()
            if not _same(got, own):
                got = {**own, "harness": f"the shared parser answered {json.dumps(got)[:600]}"}
        print(json.dumps(got), flush=True)
        # what this case imported and cached stays for the next ones: collected once, then frozen
        # with SGLang's modules, so the next case's gc.collect() walks only that case's objects
        gc.collect()
        gc.freeze()
    return 0


if __name__ == "__main__":
    sys.exit(main())
