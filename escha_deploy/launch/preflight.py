"""Checks native ``serve`` makes before it starts SGLang, each refusing with exit 3.

``port_free(host, port)``: the address the server will bind, as the launch spec decides it
(``ContainerSpec.port_host_ip`` / ``port_host``: ``container.expose`` and ``container.port``;
the argv renders the same values and is never read back), must be free now. SGLang binds it
only after the weights load, so a held port costs the whole load and then fails with
"OSError: [Errno 98] Address already in use" (vllm-project/vllm#9763, sglang#9396 for the same
failure on SGLang's internal ZMQ ports).
"""

from __future__ import annotations

from ..utils.errors import Refused
from .docker import bind_free, listening_process


def port_free(host: str, port: int) -> None:
    """Raise ``Refused`` (exit 3) when the server's ``host``:``port`` (an IP address and a TCP
    port, as the launch spec decides them) cannot be bound now, naming the port and the
    listening process when psutil can see it."""
    if bind_free(host, port):
        return
    owner = listening_process(port)
    raise Refused(
        f"container.port: port {port} on {host} is already in use"
        + (f" by {owner}" if owner else " (its owner is not visible to this user)")
        + ": SGLang would load the weights and then fail with \"[Errno 98] Address already in use\"; "
        "stop that server or set container.port to a free port")
