"""Checks native ``serve`` makes before it starts SGLang, each refusing with exit 3.

``port_free(argv)``: the HTTP port the server will bind (``--host``/``--port`` of its argv) must
be free now. SGLang binds it only after the weights load, so a held port costs the whole load
and then fails with "OSError: [Errno 98] Address already in use" (vllm-project/vllm#9763,
sglang#9396 for the same failure on SGLang's internal ZMQ ports).
"""

from __future__ import annotations

from typing import Sequence

from ..errors import Refused
from .docker import bind_free, listening_process

#: SGLang 0.5.19's defaults for ``--host`` / ``--port`` (``srt/server_args.py: ServerArgs``).
SGLANG_DEFAULT_HOST = "127.0.0.1"
SGLANG_DEFAULT_PORT = 30000


def _flag_value(argv: Sequence[str], flag: str) -> str | None:
    """The last value of ``flag`` in ``argv`` (``--flag V`` or ``--flag=V``), as argparse keeps it."""
    value = None
    for i, tok in enumerate(argv):
        if tok == flag and i + 1 < len(argv):
            value = argv[i + 1]
        elif tok.startswith(flag + "="):
            value = tok.split("=", 1)[1]
    return value


def port_free(argv: Sequence[str]) -> None:
    """Raise ``Refused`` (exit 3) when the server's ``--host``:``--port`` cannot be bound now,
    naming the port and the listening process when psutil can see it."""
    host = _flag_value(argv, "--host") or SGLANG_DEFAULT_HOST
    port = int(_flag_value(argv, "--port") or SGLANG_DEFAULT_PORT)
    if bind_free(host, port):
        return
    owner = listening_process(port)
    raise Refused(
        f"container.port: port {port} on {host} is already in use"
        + (f" by {owner}" if owner else " (its owner is not visible to this user)")
        + ": SGLang would load the weights and then fail with \"[Errno 98] Address already in use\"; "
        "stop that server or set container.port to a free port")
