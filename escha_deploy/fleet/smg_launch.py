"""Start SMG (``smg launch``) with the API key read from a file instead of the command line.

    python3 smg_launch.py [--api-key-file FILE] -- SMG_FLAGS...

SMG 1.13 takes ``--api-key`` only as a command-line flag (``smg/router_args.py``); ``smg launch``
itself is a Python entry point that parses its arguments with ``smg.launch_router.
parse_router_args`` and starts the Rust router in-process (``smg/launch_router.py``). This file
does the same with the key appended to the argument list in memory, so the key never appears in
``/proc/PID/cmdline``, ``ps``, container labels or ``docker inspect``. Standalone on purpose
(standard library and ``smg`` only): the router image copies this one file.
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    key_file = None
    if argv[:1] == ["--api-key-file"]:
        if len(argv) < 2:
            sys.exit("smg_launch: --api-key-file needs a path")
        key_file, argv = argv[1], argv[2:]
    if argv[:1] == ["--"]:
        argv = argv[1:]
    if "--api-key" in argv:
        sys.exit("smg_launch: pass the key with --api-key-file, not --api-key")
    if key_file is not None:
        try:
            with open(key_file, encoding="utf-8") as f:
                key = f.read().strip()
        except OSError as exc:
            sys.exit(f"smg_launch: cannot read the API key file {key_file}: {exc.strerror}")
        if not key:
            sys.exit(f"smg_launch: the API key file {key_file} is empty")
        argv += ["--api-key", key]
    from smg.launch_router import launch_router, parse_router_args

    launch_router(parse_router_args(argv))


if __name__ == "__main__":
    main()
