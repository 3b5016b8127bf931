"""Addresses as Go's ``net`` package reads them: listening and dialling as Toxiproxy does."""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from typing import Any

from loadtest.toxiproxy_standin.errors import bad_request, internal_error


def split_hostport(address: str) -> tuple[str, int]:
    """Split ``host:port`` / ``[v6]:port``; an empty host means all interfaces."""
    host, sep, port_text = address.rpartition(":")
    if not sep or not port_text.isdigit() or int(port_text) > 65535:
        raise bad_request(f"invalid address {address!r}, want host:port")
    return host.strip("[]"), int(port_text)


def format_hostport(sockname: Any) -> str:
    host, port = str(sockname[0]), int(sockname[1])
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def go_split_hostport(address: str) -> tuple[str, str]:
    """Go's ``net.SplitHostPort``: ``ValueError`` with Go's message if it would fail."""
    if address.startswith("["):
        host, bracket, rest = address[1:].partition("]")
        if not bracket:
            raise ValueError(f"address {address}: missing ']' in address")
        if not rest.startswith(":"):
            problem = "missing port in address" if not rest else "unexpected ']' in address"
            raise ValueError(f"address {address}: {problem}")
        return host, rest[1:]
    host, colon, port = address.rpartition(":")
    if not colon:
        raise ValueError(f"address {address}: missing port in address")
    if ":" in host:
        raise ValueError(f"address {address}: too many colons in address")
    return host, port


def go_port(port: str) -> int:
    """A port as Go's ``net.Listen`` reads it: empty means any, names are services."""
    if not port:
        return 0
    if port.isdigit():
        if int(port) > 65535:
            raise ValueError(f"address {port}: invalid port")
        return int(port)
    try:
        return socket.getservbyname(port, "tcp")
    except OSError as exc:
        raise ValueError(f"lookup tcp/{port}: unknown port") from exc


async def resolve_listen_host(host: str) -> tuple[socket.AddressFamily, str]:
    """The one address Go's ``net.Listen`` binds for ``host``.

    No host, ``0.0.0.0`` or ``::`` is every interface, on one dual-stack socket
    (Go reports it as ``[::]:PORT``); a name is resolved to one address, IPv4 first.
    """
    try:
        literal = ipaddress.ip_address(host.partition("%")[0]) if host else None
    except ValueError:
        literal = None
    if not host or (literal is not None and literal.is_unspecified):
        return (socket.AF_INET6, "::") if socket.has_dualstack_ipv6() else (socket.AF_INET, "")
    if literal is not None:
        family = socket.AF_INET6 if literal.version == 6 else socket.AF_INET
        return family, host
    return await _lookup(host)


async def _lookup(host: str) -> tuple[socket.AddressFamily, str]:
    """The one address Go picks for a name: the first IPv4 one, else the first."""
    loop = asyncio.get_running_loop()
    try:
        infos = await loop.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise ValueError(f"lookup {host}: no such host") from exc
    infos.sort(key=lambda info: info[0] != socket.AF_INET)
    return infos[0][0], str(infos[0][4][0])


async def resolve_tcp_addr(address: str) -> str:
    """Go's ``net.ResolveTCPAddr("tcp", address).String()``: a name becomes its
    address, a literal stays as written (``0.0.0.0``), no host stays empty."""
    host, port_text = go_split_hostport(address)
    port = go_port(port_text)
    if not host:
        return f":{port}"
    try:
        ip = str(ipaddress.ip_address(host))
    except ValueError:
        _family, ip = await _lookup(host)
    return format_hostport((ip, port))


async def listen_like_go(listen: str) -> socket.socket:
    """A listening socket for ``listen``, as Toxiproxy's ``net.Listen("tcp", listen)``.

    Raises :class:`ApiError` 500 with Go's error text when it cannot listen.
    """
    try:
        host, port_text = go_split_hostport(listen)
        port = go_port(port_text)
        family, address = await resolve_listen_host(host)
    except ValueError as exc:
        raise internal_error(f"listen tcp: {exc}") from exc
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6 and address == "::":
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        sock.bind((address, port))
        sock.listen(socket.SOMAXCONN)
    except OSError as exc:
        sock.close()
        shown = f"[{address}]:{port}" if ":" in address else f"{address}:{port}"
        reason = (exc.strerror or str(exc)).lower()
        raise internal_error(f"listen tcp {shown}: bind: {reason}") from exc
    sock.setblocking(False)
    return sock
