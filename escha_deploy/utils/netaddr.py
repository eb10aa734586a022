"""One network address type for every place a host is written down, joined with a port or put
in a URL: a fleet box's ``address``, ``--dist-init-addr``, the router's worker URLs, compose
port bindings.

A host is an IPv4 address, an IPv6 address or a host name. It is kept bare (``fd00::20``, not
``[fd00::20]``): values that take a host only, such as SGLang's ``--host``, get it as it is. Where
a host is joined with a port the IPv6 form is bracketed, because a bare one is ambiguous:

- SGLang 0.5.19 ``srt/utils/network.py: NetworkAddress.parse`` refuses ``fd00::20:20000``
  ("Bare IPv6 address without brackets is ambiguous") and accepts ``[fd00::20]:20000``
  (sglang#2892, fixed by PR #3949);
- a URL's host is an ``IP-literal`` in brackets (RFC 3986 section 3.2.2); SMG 1.13 exits on
  ``http://fd00::20:30000`` ("Invalid URL format: invalid port number");
- a compose port binding takes the bracketed form ``[::1]:30000:30000`` (the compose
  specification's ``ports`` short syntax; docker-compose 1.29 reads it as host IP ``::1``,
  port 30000), which no reader can split another way.

``parse_host`` is the one parser (``Host``: the bare text and its kind); ``host_port`` and
``url`` are the one rendering of each joined form. ``HostAddress`` is the pydantic field type:
a value that does not parse is one line naming the field, at load time.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from typing import Annotated, Literal

from pydantic import AfterValidator

#: One host-name label (RFC 1123 section 2.1: letters, digits, hyphens; not starting or ending
#: with a hyphen; at most 63 characters).
_LABEL = re.compile(r"^(?!-)[a-z0-9-]{1,63}(?<!-)$")

#: Host names are at most 253 characters without the trailing dot (RFC 1035 section 2.3.4).
_MAX_NAME = 253


@dataclass(frozen=True)
class Host:
    """A parsed host. ``text``: bare and canonical (IPv6 compressed and lower case, as
    ``ipaddress`` writes it; host names lower case, no trailing dot). ``kind``: which of the
    three it is."""

    text: str
    kind: Literal["ipv4", "ipv6", "hostname"]

    def with_port(self, port: int) -> str:
        """``HOST:PORT``, ``[HOST]:PORT`` for IPv6: what ``--dist-init-addr`` and a compose
        port binding take."""
        return f"[{self.text}]:{port}" if self.kind == "ipv6" else f"{self.text}:{port}"

    def url(self, port: int, scheme: str = "http") -> str:
        """``SCHEME://HOST:PORT`` with the IPv6 literal bracketed (RFC 3986 section 3.2.2)."""
        return f"{scheme}://{self.with_port(port)}"

    @property
    def is_loopback(self) -> bool:
        """127.0.0.0/8, ::1 or ``localhost``: reachable from this machine only."""
        if self.kind == "hostname":
            return self.text == "localhost"
        return ipaddress.ip_address(self.text).is_loopback


def parse_host(text: str, *, peer: bool = True) -> Host:
    """Parse a bare host: an IPv4 address (dotted quad), an IPv6 address (bare or in brackets)
    or a host name (RFC 1123 labels). Raises ``ValueError`` with one sentence saying what is
    wrong and what to write instead: a port or a URL attached, an IPv6 zone id (it names an
    interface of one machine, so no other box can use it), the unspecified address (0.0.0.0,
    ``::``: what a server binds, not where peers connect; allowed with ``peer=False``, for a
    bind address), anything else."""
    if not isinstance(text, str) or not text.strip():
        raise ValueError("an address is a host name or an IP address, not empty")
    s = text.strip()
    if any(c.isspace() for c in s):
        raise ValueError(f"{s!r} has white space inside; give one host name or IP address")
    if "://" in s or "/" in s:
        raise ValueError(f"{s!r} is a URL or a path; give the host only (the port and the scheme come from the "
                         "profile and the fleet)")
    bracketed = s.startswith("[")
    if bracketed:
        close = s.find("]")
        if close == -1:
            raise ValueError(f"{s!r}: missing the closing bracket of an IPv6 address")
        if s[close + 1:]:
            raise ValueError(f"{s!r} carries a port; give the host only ({s[:close + 1]}): the port comes from "
                             "container.port and dist_init_port")
        s = s[1:close]
    if "%" in s:
        raise ValueError(f"{text.strip()!r} has an IPv6 zone id (%...), which names an interface of one machine; "
                         "give a global or unique-local IPv6 address")
    if ":" in s:
        try:
            ip6 = ipaddress.IPv6Address(s)
        except ValueError:
            host, _, port = s.rpartition(":")
            if port.isdigit() and host and not bracketed:
                if ":" not in host:
                    raise ValueError(f"{s!r} carries a port; give the host only ({host}): the port comes from "
                                     "container.port and dist_init_port") from None
                if _is_ipv6(host):
                    raise ValueError(f"{s!r} is not an IPv6 address; to join one with a port write [{host}]:{port}, "
                                     f"and here give the host only ({host})") from None
            raise ValueError(f"{s!r} is not an IPv6 address") from None
        if peer and ip6.is_unspecified:
            raise ValueError(f"{s!r} is the unspecified address (what a server binds), not one peers can reach")
        return Host(text=str(ip6), kind="ipv6")
    if bracketed:
        raise ValueError(f"[{s}]: brackets hold an IPv6 address only")
    if re.fullmatch(r"[0-9.]+", s):
        try:
            ip4 = ipaddress.IPv4Address(s)
        except ValueError as exc:
            raise ValueError(f"{s!r} is not an IPv4 address ({exc})") from None
        if peer and ip4.is_unspecified:
            raise ValueError(f"{s!r} is the unspecified address (what a server binds), not one peers can reach")
        return Host(text=str(ip4), kind="ipv4")
    name = s.lower().removesuffix(".")
    labels = name.split(".")
    if len(name) > _MAX_NAME or not all(_LABEL.match(label) for label in labels):
        raise ValueError(f"{s!r} is not a host name (letters, digits and '-' in dot-separated labels of at most "
                         "63 characters) nor an IP address")
    if labels[-1].isdigit():
        raise ValueError(f"{s!r} is neither an IPv4 address nor a host name (a name's last label is not all digits)")
    return Host(text=name, kind="hostname")


def _is_ipv6(text: str) -> bool:
    try:
        ipaddress.IPv6Address(text)
    except ValueError:
        return False
    return True


def host_port(host: str, port: int) -> str:
    """``HOST:PORT`` of a bare host, bracketed when it is IPv6 (``[fd00::20]:20000``); a bind
    address (0.0.0.0, ``::``) is rendered too."""
    return parse_host(host, peer=False).with_port(port)


def url(host: str, port: int, scheme: str = "http") -> str:
    """``http://HOST:PORT`` of a bare host, bracketed when it is IPv6 (``http://[::1]:30000``)."""
    return parse_host(host, peer=False).url(port, scheme)


def _canonical(text: str) -> str:
    return parse_host(text).text


#: The pydantic field type of a box address: parsed by ``parse_host``, stored bare and canonical.
HostAddress = Annotated[str, AfterValidator(_canonical)]
