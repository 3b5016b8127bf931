"""The Toxiproxy stand-in's own tests, driven only through toxiproxy-python and requests.

They go through loadtest/wan.py like everything else, so with ``TOXIPROXY_URL``
set they run unchanged against a real ``toxiproxy-server`` (on this host, since
the upstreams listen on 127.0.0.1).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import socket
import socketserver
import threading
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import pytest
import requests
from toxiproxy.exceptions import InvalidToxic, NotFound, ProxyExists

from loadtest.toxiproxy_standin.addresses import resolve_listen_host
from loadtest.toxiproxy_standin.link import ReceiveBuffers
from loadtest.toxiproxy_standin.toxics import RUNTIMES, TOXIC_ATTRIBUTES, Chunk, Toxic
from loadtest.wan import (
    WanProxy,
    add_bandwidth,
    add_latency,
    create_hub_proxy,
    start_toxiproxy,
    toxiproxy_client,
    wan_link,
)

LOCALHOST = "127.0.0.1"
IO_TIMEOUT = 5.0

# --------------------------------------------------------------------------- upstreams


class _EchoHandler(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        sock: socket.socket = self.request
        sock.settimeout(10)  # a stuck test must not leave the thread behind forever
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with contextlib.suppress(OSError):
            while data := sock.recv(65536):
                sock.sendall(data)


class _BlobHandler(socketserver.StreamRequestHandler):
    """Reads a decimal byte count on a line, sends that many bytes, then closes."""

    timeout = 10

    def handle(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            count = int(self.rfile.readline())
            self.wfile.write(b"x" * count)


class _ThreadedServer(socketserver.ThreadingTCPServer):
    allow_reuse_address = True
    daemon_threads = True


@contextlib.contextmanager
def _serve(handler: type[socketserver.BaseRequestHandler]) -> Iterator[str]:
    server = _ThreadedServer((LOCALHOST, 0), handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        host, port = server.server_address[:2]
        yield f"{host!s}:{port}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@pytest.fixture(scope="module")
def echo_upstream() -> Iterator[str]:
    with _serve(_EchoHandler) as address:
        yield address


@pytest.fixture(scope="module")
def blob_upstream() -> Iterator[str]:
    with _serve(_BlobHandler) as address:
        yield address


# --------------------------------------------------------------------------- toxiproxy


@pytest.fixture(scope="module")
def api_url() -> Iterator[str]:
    with start_toxiproxy() as url:
        yield url


@pytest.fixture
def client(api_url: str) -> Iterator[Any]:
    client = toxiproxy_client(api_url)
    # Each test owns the whole server (also one given by TOXIPROXY_URL): start clean.
    client.destroy_all()
    yield client
    client.destroy_all()


def _create(client: Any, upstream: str, name: str) -> Any:
    return client.create(upstream=upstream, name=name, listen=f"{LOCALHOST}:0")


# --------------------------------------------------------------------------- socket helpers


def _connect(listen: str) -> socket.socket:
    host, _, port = listen.rpartition(":")
    sock = socket.create_connection((host, int(port)), timeout=IO_TIMEOUT)
    # Without NODELAY, Nagle + delayed ACKs add tens of ms to small writes.
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def _recv_exactly(sock: socket.socket, size: int) -> bytes:
    data = bytearray()
    while len(data) < size:
        more = sock.recv(size - len(data))
        if not more:
            raise EOFError(f"got {len(data)} of {size} bytes")
        data += more
    return bytes(data)


def _recv_until_eof(sock: socket.socket) -> bytes:
    data = bytearray()
    while more := sock.recv(1 << 20):
        data += more
    return bytes(data)


def _round_trip(sock: socket.socket, payload: bytes = b"ping") -> float:
    start = time.perf_counter()
    sock.sendall(payload)
    assert _recv_exactly(sock, len(payload)) == payload
    return time.perf_counter() - start


def _least_rtt(sock: socket.socket, samples: int = 5) -> float:
    """The link's own round trip: a loaded machine only ever adds to a sample, and a
    latency toxic is a floor, so the least of a few samples is what the toxics make."""
    return min(_round_trip(sock) for _ in range(samples))


def _assert_closed_by_peer(sock: socket.socket) -> None:
    sock.settimeout(2.0)
    with contextlib.suppress(ConnectionResetError):  # FIN or RST both mean "closed"
        assert sock.recv(100) == b""


# --------------------------------------------------------------------------- API


def test_version_and_running(client: Any) -> None:
    assert client.running()
    assert isinstance(json.loads(client.version())["version"], str)


def test_proxy_lifecycle_and_json_shapes(client: Any, api_url: str, echo_upstream: str) -> None:
    wan = create_hub_proxy(api_url, echo_upstream)
    assert isinstance(wan, WanProxy) and wan.port != 0  # "127.0.0.1:0" got a real port

    assert client.proxies()["hub"].listen == wan.listen
    shown = requests.get(f"{api_url}/proxies/hub", timeout=IO_TIMEOUT).json()
    # The real server marshals its Proxy struct, exported zerolog Logger included.
    assert shown == {
        "name": "hub",
        "listen": wan.listen,
        "upstream": echo_upstream,
        "enabled": True,
        "Logger": {},
        "toxics": [],
    }
    assert list(shown) == ["name", "listen", "upstream", "enabled", "Logger", "toxics"]

    wan.proxy.add_toxic(type="latency", attributes={"latency": 5})
    toxic = {
        "attributes": {"latency": 5, "jitter": 0},
        "name": "latency_downstream",
        "type": "latency",
        "stream": "downstream",
        "toxicity": 1,
    }
    listed = requests.get(f"{api_url}/proxies/hub/toxics", timeout=IO_TIMEOUT)
    assert listed.json() == [toxic]
    # Go's json.Marshal: ToxicWrapper's field order, compact, a float32 1 written as 1.
    assert listed.text == (
        '[{"attributes":{"latency":5,"jitter":0},"name":"latency_downstream",'
        '"type":"latency","stream":"downstream","toxicity":1}]'
    )
    assert requests.get(f"{api_url}/proxies/hub", timeout=IO_TIMEOUT).json()["toxics"] == [toxic]
    assert wan.proxy.get_toxic("latency_downstream").attributes["latency"] == 5

    with contextlib.closing(_connect(wan.listen)) as sock:
        _round_trip(sock, b"hello through the proxy")

    # Recreating the hub (as each test run does) replaces it, toxics and all.
    again = create_hub_proxy(api_url, echo_upstream)
    assert again.proxy.toxics() == {}
    assert again.proxy.destroy()
    assert client.get_proxy("hub") is None


def test_api_errors_are_json(client: Any, api_url: str, echo_upstream: str) -> None:
    def error(reply: requests.Response, status: int) -> str:
        assert reply.status_code == status
        body = reply.json()
        assert body["status"] == status and isinstance(body["error"], str) and body["error"]
        return str(body["error"])

    missing = requests.get(f"{api_url}/proxies/missing", timeout=IO_TIMEOUT)
    assert error(missing, 404) == "proxy not found"

    proxy = _create(client, echo_upstream, "errs")
    spec = {"name": "errs", "upstream": echo_upstream, "listen": f"{LOCALHOST}:0"}
    duplicate = requests.post(f"{api_url}/proxies", json=spec, timeout=IO_TIMEOUT)
    assert error(duplicate, 409) == "proxy already exists"
    with pytest.raises(ProxyExists):
        _create(client, echo_upstream, "errs")

    proxy.add_toxic(type="latency", name="lat", attributes={"latency": 1})
    with pytest.raises(ProxyExists):  # 409 "toxic already exists"
        proxy.add_toxic(type="latency", name="lat")
    with pytest.raises(InvalidToxic):  # 400 "invalid toxic type"
        proxy.add_toxic(type="no_such_toxic")
    sideways = {"type": "latency", "stream": "sideways"}
    error(requests.post(f"{api_url}/proxies/errs/toxics", json=sideways, timeout=IO_TIMEOUT), 400)
    bad_json = requests.post(f"{api_url}/proxies", data=b"{not json", timeout=IO_TIMEOUT)
    error(bad_json, 400)
    no_upstream = {"name": "no_upstream"}
    error(requests.post(f"{api_url}/proxies", json=no_upstream, timeout=IO_TIMEOUT), 400)

    no_toxic = requests.delete(f"{api_url}/proxies/errs/toxics/missing", timeout=IO_TIMEOUT)
    assert error(no_toxic, 404) == "toxic not found"
    with pytest.raises(NotFound):
        proxy.destroy_toxic("missing")
    proxy.destroy()
    with pytest.raises(NotFound):
        proxy.add_toxic(type="latency")


def test_reset_reenables_proxies_and_removes_toxics(client: Any, echo_upstream: str) -> None:
    slow = _create(client, echo_upstream, "reset_slow")
    down = _create(client, echo_upstream, "reset_down")
    slow.add_toxic(type="latency", attributes={"latency": 500})
    down.add_toxic(type="timeout", attributes={"timeout": 0})
    down.disable()

    assert client.reset()

    for name in ("reset_slow", "reset_down"):
        proxy = client.get_proxy(name)
        assert proxy.enabled and proxy.toxics() == {}
        with contextlib.closing(_connect(proxy.listen)) as sock:
            assert _round_trip(sock) < 0.1


def test_populate_creates_and_replaces(
    client: Any, api_url: str, echo_upstream: str, blob_upstream: str
) -> None:
    specs = [
        {"name": name, "listen": f"{LOCALHOST}:0", "upstream": echo_upstream}
        for name in ("pop_a", "pop_b")
    ]
    reply = requests.post(f"{api_url}/populate", json=specs, timeout=IO_TIMEOUT)
    assert reply.status_code == 201
    proxies = reply.json()["proxies"]
    assert [p["name"] for p in proxies] == ["pop_a", "pop_b"]
    assert all(p["enabled"] and p["toxics"] == [] for p in proxies)
    with contextlib.closing(_connect(proxies[0]["listen"])) as sock:
        _round_trip(sock)

    # Same name, different upstream: the proxy is replaced.
    replacement = [{"name": "pop_b", "listen": proxies[1]["listen"], "upstream": blob_upstream}]
    reply = requests.post(f"{api_url}/populate", json=replacement, timeout=IO_TIMEOUT)
    assert reply.status_code == 201
    assert client.get_proxy("pop_b").upstream == blob_upstream

    invalid = requests.post(f"{api_url}/populate", json=[{"name": "pop_c"}], timeout=IO_TIMEOUT)
    assert invalid.status_code == 400 and invalid.json()["status"] == 400

    made = client.populate([{"name": "pop_d", "upstream": echo_upstream, "listen": "127.0.0.1:0"}])
    assert [p.name for p in made] == ["pop_d"]


# --------------------------------------------------------------------------- toxics


def test_latency_adds_to_round_trip_on_live_connection(
    client: Any, api_url: str, echo_upstream: str
) -> None:
    wan = create_hub_proxy(api_url, echo_upstream)
    with contextlib.closing(_connect(wan.listen)) as sock:
        base = _least_rtt(sock)
        (name,) = add_latency(wan.proxy, 60)  # added while the connection is open
        delayed = _least_rtt(sock)
        assert 0.050 <= delayed - base <= 0.070

        wan.proxy.destroy_toxic(name)
        assert _least_rtt(sock) - base < 0.010


def test_wan_link_yields_a_delayed_url_and_cleans_up(
    client: Any, api_url: str, echo_upstream: str
) -> None:
    with wan_link(api_url, f"http://{echo_upstream}/base?q=1", latency_ms=60) as url:
        parts = urlsplit(url)
        assert (parts.scheme, parts.path, parts.query) == ("http", "/base", "q=1")
        assert parts.netloc == client.get_proxy("hub").listen
        with contextlib.closing(_connect(parts.netloc)) as sock:
            assert 0.055 <= _least_rtt(sock, 3) <= 0.075
    assert client.get_proxy("hub") is None


def test_latency_does_not_add_up_over_many_small_packets(
    client: Any, api_url: str, echo_upstream: str
) -> None:
    wan = create_hub_proxy(api_url, echo_upstream)
    add_latency(wan.proxy, 60)
    packets = [b"%07d," % i for i in range(20)]
    with contextlib.closing(_connect(wan.listen)) as sock:
        start = time.perf_counter()
        for packet in packets:
            sock.sendall(packet)
            time.sleep(0.005)
        sent = time.perf_counter() - start
        echoed = _recv_exactly(sock, sum(map(len, packets)))
        elapsed = time.perf_counter() - start
    assert echoed == b"".join(packets)  # order kept
    # Each packet is delayed 60 ms from when it was read: the last one arrives ~60 ms
    # after it was sent, not 20 × 60 ms after the first.
    assert sent + 0.050 <= elapsed <= sent + 0.150


def test_symmetric_latency_splits_the_round_trip(
    client: Any, api_url: str, echo_upstream: str
) -> None:
    wan = create_hub_proxy(api_url, echo_upstream)
    with contextlib.closing(_connect(wan.listen)) as sock:
        base = _least_rtt(sock)
        add_latency(wan.proxy, 60, split="symmetric")
        assert 0.050 <= _least_rtt(sock) - base <= 0.070
    latencies = {t.stream: t.attributes["latency"] for t in wan.proxy.toxics().values()}
    assert latencies == {"upstream": 30, "downstream": 30}


def test_toxic_update_applies_to_live_connection(
    client: Any, api_url: str, echo_upstream: str
) -> None:
    wan = create_hub_proxy(api_url, echo_upstream)
    (name,) = add_latency(wan.proxy, 20)
    with contextlib.closing(_connect(wan.listen)) as sock:
        assert 0.015 <= _least_rtt(sock) <= 0.030
        url = f"{api_url}/proxies/hub/toxics/{name}"
        reply = requests.post(url, json={"attributes": {"latency": 80}}, timeout=IO_TIMEOUT)
        assert reply.status_code == 200
        assert reply.json()["attributes"] == {"latency": 80, "jitter": 0}
        assert 0.075 <= _least_rtt(sock) <= 0.095


def test_toxicity_zero_has_no_effect(client: Any, api_url: str, echo_upstream: str) -> None:
    wan = create_hub_proxy(api_url, echo_upstream)
    wan.proxy.add_toxic(type="latency", toxicity=0.0, attributes={"latency": 500})
    assert wan.proxy.get_toxic("latency_downstream").toxicity == 0
    with contextlib.closing(_connect(wan.listen)) as sock:
        assert _least_rtt(sock, 3) < 0.1


def test_bandwidth_limits_throughput(client: Any, api_url: str, blob_upstream: str) -> None:
    wan = create_hub_proxy(api_url, blob_upstream)
    add_bandwidth(wan.proxy, 1000)  # 1000 KB/s = 1 MB/s
    with contextlib.closing(_connect(wan.listen)) as sock:
        start = time.perf_counter()
        sock.sendall(b"2000000\n")
        data = _recv_until_eof(sock)
        elapsed = time.perf_counter() - start
    assert len(data) == 2_000_000
    assert 1.6 <= elapsed <= 2.4


def test_timeout_stops_data_then_closes(client: Any, echo_upstream: str) -> None:
    proxy = _create(client, echo_upstream, "timeout")
    proxy.add_toxic(type="timeout", attributes={"timeout": 300})
    with contextlib.closing(_connect(proxy.listen)) as sock:
        start = time.perf_counter()
        sock.sendall(b"ping")
        assert sock.recv(100) == b""  # the echo was dropped, then the connection closed
        assert 0.25 <= time.perf_counter() - start <= 1.5


def test_timeout_zero_holds_until_removed(client: Any, echo_upstream: str) -> None:
    proxy = _create(client, echo_upstream, "timeout0")
    proxy.add_toxic(type="timeout", name="hold", attributes={"timeout": 0})
    with contextlib.closing(_connect(proxy.listen)) as sock:
        sock.sendall(b"ping")
        sock.settimeout(0.3)
        with pytest.raises(TimeoutError):
            sock.recv(100)
        # As in Toxiproxy, removing a timeout toxic closes the connections it held.
        proxy.destroy_toxic("hold")
        _assert_closed_by_peer(sock)


def test_reset_peer_resets_the_client(client: Any, echo_upstream: str) -> None:
    proxy = _create(client, echo_upstream, "reset_peer")
    proxy.add_toxic(type="reset_peer", attributes={"timeout": 100})
    with contextlib.closing(_connect(proxy.listen)) as sock:
        start = time.perf_counter()
        sock.sendall(b"ping")
        with pytest.raises(ConnectionResetError):
            sock.recv(100)
        assert time.perf_counter() - start >= 0.09


def test_limit_data_closes_after_n_bytes(client: Any, blob_upstream: str) -> None:
    proxy = _create(client, blob_upstream, "limit")
    proxy.add_toxic(type="limit_data", attributes={"bytes": 1000})
    with contextlib.closing(_connect(proxy.listen)) as sock:
        sock.sendall(b"5000\n")
        assert len(_recv_until_eof(sock)) == 1000


def test_slow_close_delays_the_close(client: Any, blob_upstream: str) -> None:
    proxy = _create(client, blob_upstream, "slow_close")
    proxy.add_toxic(type="slow_close", attributes={"delay": 300})
    with contextlib.closing(_connect(proxy.listen)) as sock:
        start = time.perf_counter()
        sock.sendall(b"10\n")
        assert _recv_exactly(sock, 10) == b"x" * 10
        assert time.perf_counter() - start < 0.2  # data is not delayed...
        assert _recv_until_eof(sock) == b""
        assert time.perf_counter() - start >= 0.28  # ...only the close


def test_disable_refuses_new_and_closes_live_connections(
    client: Any, api_url: str, echo_upstream: str
) -> None:
    wan = create_hub_proxy(api_url, echo_upstream)
    with contextlib.closing(_connect(wan.listen)) as live:
        _round_trip(live)
        wan.proxy.disable()
        _assert_closed_by_peer(live)
    assert client.get_proxy("hub").enabled is False
    with pytest.raises(ConnectionRefusedError):
        _connect(wan.listen)

    wan.proxy.enable()
    assert client.get_proxy("hub").listen == wan.listen  # same port again
    with contextlib.closing(_connect(wan.listen)) as sock:
        _round_trip(sock)

    with wan.proxy.down(), pytest.raises(ConnectionRefusedError):
        _connect(wan.listen)
    with contextlib.closing(_connect(wan.listen)) as sock:
        _round_trip(sock)


def test_many_megabytes_through_a_latency_arrive_intact_and_in_order(
    client: Any, echo_upstream: str
) -> None:
    # The stand-in passes what it reads on as views of receive buffers it uses again:
    # a buffer reused while a view of it still waits in the delay line would show
    # here as wrong bytes (random data, so no two buffers look alike).
    proxy = _create(client, echo_upstream, "bulk")
    proxy.add_toxic(type="latency", attributes={"latency": 20})
    payload = random.Random(11).randbytes(24 << 20)
    with contextlib.closing(_connect(proxy.listen)) as sock:
        sender = threading.Thread(target=sock.sendall, args=(payload,), daemon=True)
        sender.start()
        assert _recv_exactly(sock, len(payload)) == payload
        sender.join(IO_TIMEOUT)


def test_a_receive_buffer_serves_again_only_once_no_view_of_it_is_alive() -> None:
    buffers = ReceiveBuffers()
    first = buffers.take()
    view = memoryview(first)[:10]
    second = buffers.take()
    assert second is not first  # the first is still viewed
    del view
    third = buffers.take()
    assert third is first


# --------------------------------------------------------------------------- as the real server
# Each of these pins something Toxiproxy 2.12 does that a client can see.

TEXT_PLAIN = "text/plain; charset=utf-8"


def _api(method: str, url: str, **kwargs: Any) -> requests.Response:
    return requests.request(method, url, timeout=IO_TIMEOUT, **kwargs)


def _assert_go_error(reply: requests.Response, status: int, message: str) -> None:
    """Toxiproxy's apiError: the JSON goes out through Go's http.Error, as text/plain."""
    assert reply.status_code == status
    assert reply.headers["Content-Type"] == TEXT_PLAIN
    assert reply.headers["X-Content-Type-Options"] == "nosniff"
    assert reply.text == json.dumps({"error": message, "status": status},
                                    separators=(",", ":")) + "\n"  # fmt: skip


def test_errors_are_json_sent_as_text_plain(client: Any, api_url: str, echo_upstream: str) -> None:
    _assert_go_error(_api("GET", f"{api_url}/proxies/missing"), 404, "proxy not found")
    spec = {"name": "plain", "upstream": echo_upstream, "listen": f"{LOCALHOST}:0"}
    assert _api("POST", f"{api_url}/proxies", json=spec).status_code == 201
    _assert_go_error(_api("POST", f"{api_url}/proxies", json=spec), 409, "proxy already exists")
    toxics = f"{api_url}/proxies/plain/toxics"
    _assert_go_error(_api("POST", toxics, json={"type": "nope"}), 400, "invalid toxic type")
    _assert_go_error(
        _api("POST", toxics, json={"type": "latency", "stream": "sideways"}),
        400,
        "stream was invalid, can be either upstream or downstream",
    )
    _assert_go_error(_api("DELETE", f"{toxics}/missing"), 404, "toxic not found")
    _assert_go_error(_api("POST", f"{api_url}/proxies", data=b""), 400, "bad request body: EOF")
    _assert_go_error(
        _api("POST", f"{api_url}/proxies", json={"name": "x"}),
        400,
        "missing required field: upstream",
    )


def test_browser_user_agents_are_refused(client: Any, api_url: str, echo_upstream: str) -> None:
    browser = {"User-Agent": "Mozilla/5.0 (X11; Linux x86_64; rv:128.0) Gecko/20100101"}
    spec = {"name": "from_browser", "upstream": echo_upstream, "listen": f"{LOCALHOST}:0"}
    for method, path, body in [("GET", "/proxies", None), ("POST", "/proxies", spec),
                               ("POST", "/reset", None), ("GET", "/version", None)]:  # fmt: skip
        reply = _api(method, f"{api_url}{path}", json=body, headers=browser)
        assert reply.status_code == 403
        assert reply.headers["Content-Type"] == TEXT_PLAIN
        assert reply.text == "User agent not allowed\n"
    assert client.get_proxy("from_browser") is None  # refused before it was acted on


def test_unknown_paths_and_methods_answer_as_gorilla_mux(api_url: str) -> None:
    missing = _api("GET", f"{api_url}/no/such/path")
    assert (missing.status_code, missing.text) == (404, "404 page not found\n")
    assert missing.headers["Content-Type"] == TEXT_PLAIN
    for method, path in [("PUT", "/proxies"), ("HEAD", "/version"), ("GET", "/reset")]:
        reply = _api(method, f"{api_url}{path}")
        assert (reply.status_code, reply.content) == (405, b""), (method, path)
    # Matched routes carry zerolog's request id (an xid); unmatched ones do not.
    ids = {_api("GET", f"{api_url}/proxies").headers["X-Toxiproxy-Request-Id"] for _ in range(3)}
    assert len(ids) == 3 and all(len(i) == 20 and i.isalnum() for i in ids)
    assert "X-Toxiproxy-Request-Id" not in missing.headers


def test_version_reply_is_written_by_hand(api_url: str) -> None:
    reply = _api("GET", f"{api_url}/version")
    assert reply.headers["Content-Type"] == "application/json;charset=utf-8"
    version = reply.json()["version"]
    assert reply.text == f'{{"version": "{version}"}}\n'


def test_proxy_index_is_sorted_by_name(client: Any, api_url: str, echo_upstream: str) -> None:
    for name in ("zulu", "alpha", "mike"):
        _create(client, echo_upstream, name)
    reply = _api("GET", f"{api_url}/proxies")
    assert list(reply.json()) == ["alpha", "mike", "zulu"]  # a Go map marshals sorted
    assert reply.headers["Content-Type"] == "application/json"


def test_omitted_listen_means_every_interface(
    client: Any, api_url: str, echo_upstream: str
) -> None:
    # Not enabled, so nothing listens: tests bind only to 127.0.0.1.
    spec = {"name": "anywhere", "upstream": echo_upstream, "enabled": False}
    reply = _api("POST", f"{api_url}/proxies", json=spec)
    assert reply.status_code == 201
    assert reply.json()["listen"] == ""  # not a loopback address put in its place


def test_go_listen_picks_the_address_net_listen_would() -> None:
    def resolve(host: str) -> tuple[int, str]:
        return asyncio.run(resolve_listen_host(host))

    wildcard = (socket.AF_INET6, "::") if socket.has_dualstack_ipv6() else (socket.AF_INET, "")
    assert resolve("") == resolve("0.0.0.0") == resolve("::") == wildcard
    assert resolve("127.0.0.1") == (socket.AF_INET, "127.0.0.1")
    assert resolve("localhost") == (socket.AF_INET, "127.0.0.1")  # one address, IPv4 first


def test_listen_and_upstream_are_checked_as_go_does(
    client: Any, api_url: str, echo_upstream: str
) -> None:
    # An unusable listen address is the listener's error, a 500; the upstream is not
    # checked until a client connects.
    bad_listen = {"name": "no_port", "upstream": echo_upstream, "listen": LOCALHOST}
    _assert_go_error(
        _api("POST", f"{api_url}/proxies", json=bad_listen),
        500,
        f"listen tcp: address {LOCALHOST}: missing port in address",
    )
    assert client.get_proxy("no_port") is None
    odd = {"name": "odd_upstream", "upstream": "no-port-here", "listen": f"{LOCALHOST}:0"}
    created = _api("POST", f"{api_url}/proxies", json=odd)
    assert created.status_code == 201 and created.json()["upstream"] == "no-port-here"
    with contextlib.closing(_connect(created.json()["listen"])) as sock:
        _assert_closed_by_peer(sock)  # it could not dial, so it hung up


def test_bodies_are_decoded_as_go_decodes_them(
    client: Any, api_url: str, echo_upstream: str
) -> None:
    # Only the first JSON value counts, keys match fields whatever their case.
    body = f'{{"NAME":"go_decoded","Upstream":"{echo_upstream}","listen":"{LOCALHOST}:0"}} tail'
    created = _api("POST", f"{api_url}/proxies", data=body.encode())
    assert created.status_code == 201 and created.json()["name"] == "go_decoded"
    toxics = f"{api_url}/proxies/go_decoded/toxics"
    made = _api(
        "POST", toxics, json={"type": "latency", "attributes": {"Latency": 7, "jitter": None}}
    )
    assert made.json()["attributes"] == {"latency": 7, "jitter": 0}
    # Integer attributes refuse anything but an integer literal.
    for literal in ('"5"', "1.5", "1.0", "1e3", "true", "9223372036854775808"):
        raw = f'{{"type":"latency","name":"t","attributes":{{"latency":{literal}}}}}'
        reply = _api("POST", toxics, data=raw.encode())
        assert reply.status_code == 400, literal
        assert reply.json()["error"].startswith("bad request body: json: cannot unmarshal")
    # A name clash is found before the attributes are looked at.
    clash = {"type": "latency", "name": "latency_downstream", "attributes": {"latency": "x"}}
    _assert_go_error(_api("POST", toxics, json=clash), 409, "toxic already exists")


def test_stream_is_kept_as_written(client: Any, api_url: str, echo_upstream: str) -> None:
    proxy = _create(client, echo_upstream, "streams")
    toxics = f"{api_url}/proxies/streams/toxics"
    made = _api("POST", toxics, json={"type": "latency", "stream": "UpStream"}).json()
    assert (made["name"], made["stream"]) == ("latency_UpStream", "UpStream")
    _api("POST", toxics, json={"type": "latency", "name": "down"})
    # Listed with the upstream chain first, so it does act on the upstream stream.
    assert [t["name"] for t in _api("GET", toxics).json()] == ["latency_UpStream", "down"]
    _assert_go_error(
        _api("POST", toxics, json={"type": "latency", "stream": ""}),
        400,
        "stream was invalid, can be either upstream or downstream",
    )
    assert set(proxy.toxics()) == {"latency_UpStream", "down"}


def test_populate_as_toxiproxy(client: Any, api_url: str, echo_upstream: str) -> None:
    empty = _api("POST", f"{api_url}/populate", json=[])
    assert (empty.status_code, empty.json()) == (201, {"proxies": None})  # Go's nil slice
    # Entries are applied in order, so of two with one name the last one stays.
    here = f"{LOCALHOST}:0"
    twice = [{"name": "dup", "upstream": echo_upstream, "listen": here}] * 2
    reply = _api("POST", f"{api_url}/populate", json=twice)
    assert reply.status_code == 201 and [p["name"] for p in reply.json()["proxies"]] == ["dup"] * 2
    assert client.get_proxy("dup").listen == reply.json()["proxies"][1]["listen"]
    # One that cannot listen stops the rest; those before it stay, and are listed.
    mixed = [{"name": "pop_ok", "upstream": echo_upstream, "listen": here},
             {"name": "pop_bad", "upstream": echo_upstream, "listen": LOCALHOST},
             {"name": "pop_never", "upstream": echo_upstream, "listen": here}]  # fmt: skip
    failed = _api("POST", f"{api_url}/populate", json=mixed)
    assert failed.status_code == 500 and failed.headers["Content-Type"] == "application/json"
    body = failed.json()
    assert (body["error"], body["status"]) == (
        f"listen tcp: address {LOCALHOST}: missing port in address",
        500,
    )
    assert [p["name"] for p in body["proxies"]] == ["pop_ok"]
    assert client.get_proxy("pop_ok") is not None
    assert client.get_proxy("pop_bad") is None and client.get_proxy("pop_never") is None


def test_a_listen_address_that_resolves_the_same_is_no_change(
    client: Any, api_url: str, echo_upstream: str
) -> None:
    proxy = _create(client, echo_upstream, "by_name")
    port = proxy.listen.rpartition(":")[2]
    with contextlib.closing(_connect(proxy.listen)) as sock:
        _round_trip(sock)
        # Toxiproxy 2.12 resolves the new address first: "localhost:PORT" is where it
        # listens already, so it does not restart (which would drop this connection).
        same = {"listen": f"localhost:{port}", "upstream": echo_upstream}
        reply = _api("PATCH", f"{api_url}/proxies/by_name", json=same)
        assert reply.status_code == 200 and reply.json()["listen"] == proxy.listen
        _round_trip(sock)


def _wait_closed(sock: socket.socket, timeout: float) -> float:
    """Wait (bounded) until the peer closes ``sock``, dropping what it sends; return when."""
    deadline = time.monotonic() + timeout
    while (remaining := deadline - time.monotonic()) > 0:
        sock.settimeout(remaining)
        try:
            if sock.recv(65536) == b"":
                return time.monotonic()
        except ConnectionResetError:
            return time.monotonic()
        except TimeoutError:
            break
    raise AssertionError(f"still open after {timeout} s")


def _is_open(sock: socket.socket) -> bool:
    sock.setblocking(False)
    try:
        return sock.recv(1) != b""
    except BlockingIOError:
        return True
    except ConnectionResetError:
        return False
    finally:
        sock.setblocking(True)


def test_timeout_countdown_starts_over_with_each_chunk(client: Any, echo_upstream: str) -> None:
    proxy = _create(client, echo_upstream, "timeout_traffic")
    proxy.add_toxic(type="timeout", attributes={"timeout": 2000})
    with contextlib.closing(_connect(proxy.listen)) as sock:
        # Echoed chunks reach the toxic (and are dropped) every 100 ms, for longer
        # than the timeout: each one starts the countdown over, so the close comes
        # 2 s after the last chunk, not 2 s after the start. (Only lower bounds: a
        # loaded machine can only make things later.)
        started = time.monotonic()
        last_sent = started
        while last_sent - started < 3.0 and _is_open(sock):
            sock.sendall(b"tick")
            last_sent = time.monotonic()
            time.sleep(0.1)
        assert _wait_closed(sock, 10) - last_sent >= 1.95


def test_adding_a_toxic_restarts_the_one_before_it(client: Any, echo_upstream: str) -> None:
    proxy = _create(client, echo_upstream, "timeout_neighbour")
    proxy.add_toxic(type="timeout", name="countdown", attributes={"timeout": 2000})
    with contextlib.closing(_connect(proxy.listen)) as sock:
        sock.sendall(b"x")  # dropped: nothing comes back
        time.sleep(1.0)
        added = time.monotonic()
        # Toxiproxy interrupts the toxic before a new one and runs it again.
        proxy.add_toxic(type="latency", name="after", attributes={"latency": 1})
        assert _wait_closed(sock, 10) - added >= 1.9  # not 1 s after: it started over


def test_timeout_holds_a_stream_whose_input_ended(client: Any, echo_upstream: str) -> None:
    proxy = _create(client, echo_upstream, "timeout_eof")
    proxy.add_toxic(type="timeout", name="held", stream="upstream", attributes={"timeout": 200})
    with contextlib.closing(_connect(proxy.listen)) as sock:
        sock.sendall(b"dropped")
        sock.shutdown(socket.SHUT_WR)  # the toxic's input ends: its countdown stops
        sock.settimeout(1.0)
        with pytest.raises(TimeoutError):
            sock.recv(100)
        proxy.destroy_toxic("held")  # its cleanup closes the stream
        _assert_closed_by_peer(sock)


def _rerun(api_url: str, proxy: str, toxic: str) -> float:
    """Update ``toxic`` to what it is (Toxiproxy runs it again); return when it was asked."""
    asked = time.monotonic()
    reply = _api("PATCH", f"{api_url}/proxies/{proxy}/toxics/{toxic}", json={})
    assert reply.status_code == 200
    return asked


def test_an_update_releases_the_chunk_a_latency_holds(
    client: Any, api_url: str, echo_upstream: str
) -> None:
    proxy = _create(client, echo_upstream, "latency_rerun")
    proxy.add_toxic(type="latency", name="slow", stream="upstream", attributes={"latency": 10000})
    with contextlib.closing(_connect(proxy.listen)) as sock:
        sock.sendall(b"ping")
        time.sleep(1.0)  # the chunk is read at once and waits in the toxic
        _rerun(api_url, "latency_rerun", "slow")
        sock.settimeout(5.0)  # not the 9 s of latency it had left
        assert _recv_exactly(sock, 4) == b"ping"


def test_an_update_releases_what_a_bandwidth_holds(
    client: Any, api_url: str, blob_upstream: str
) -> None:
    proxy = _create(client, blob_upstream, "bandwidth_rerun")
    proxy.add_toxic(type="bandwidth", name="thin", attributes={"rate": 1})  # 10 s for 10 kB
    with contextlib.closing(_connect(proxy.listen)) as sock:
        sock.sendall(b"10000\n")
        first = _recv_exactly(sock, 100)
        asked = _rerun(api_url, "bandwidth_rerun", "thin")
        rest = bytearray()
        deadline = asked + 5.0  # the rest of the chunk goes out at once, not over 9 s
        while (remaining := deadline - time.monotonic()) > 0:
            sock.settimeout(remaining)
            if not (more := sock.recv(65536)):
                break
            rest += more
        assert len(first) + len(rest) == 10000


def test_an_update_starts_a_slow_close_over(client: Any, api_url: str, blob_upstream: str) -> None:
    proxy = _create(client, blob_upstream, "slow_close_rerun")
    proxy.add_toxic(type="slow_close", name="lingering", attributes={"delay": 1500})
    with contextlib.closing(_connect(proxy.listen)) as sock:
        sock.sendall(b"10\n")
        assert _recv_exactly(sock, 10) == b"x" * 10  # then the upstream closes
        time.sleep(0.75)
        asked = _rerun(api_url, "slow_close_rerun", "lingering")
        assert _wait_closed(sock, 10) - asked >= 1.45  # the 1.5 s count from the update


# --------------------------------------------------------------------------- toxics, in-process
# What these toxics do with the bytes cannot be seen through TCP (it coalesces
# writes), so they run here with stand-ins for their link: a fake link is fine.


class _FakeLink:
    """Just what a toxic runtime calls on its link."""

    def __init__(self) -> None:
        self.resets = 0
        self.connection = self

    def reset(self) -> None:
        self.resets += 1

    async def pause(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


class _Collect:
    """An outlet that keeps what the toxic emits."""

    def __init__(self) -> None:
        self.chunks: list[bytes] = []

    async def emit(self, chunk: Any) -> None:
        self.chunks.append(bytes(chunk.data))


def _runtime(toxic_type: str, **attributes: int) -> Any:
    toxic = Toxic(
        "t", toxic_type, "downstream", 1.0, {**TOXIC_ATTRIBUTES[toxic_type], **attributes}
    )
    return RUNTIMES[toxic_type](toxic, _FakeLink())  # type: ignore[arg-type]


def test_slicer_halves_as_toxiproxy_does() -> None:
    slicer = _runtime("slicer", average_size=10, size_variation=0)
    out = _Collect()
    data = bytes(range(100))
    asyncio.run(slicer.pipe(Chunk(data, 0.0), out))
    # 100 -> 50 + 50 -> 25 + 25 ... -> pieces of 6 and 7: halved until within 0 of 10 or
    # smaller, never cut into runs of exactly 10.
    assert [len(c) for c in out.chunks] == [6, 6, 6, 7] * 4
    assert b"".join(out.chunks) == data


def test_latency_jitter_spans_minus_jitter_to_jitter_minus_one() -> None:
    latency = _runtime("latency", latency=0, jitter=1)
    samples = {round(latency._sample() * 1000) for _ in range(500)}
    assert samples == {-1, 0}  # Go's rand.Int63n(2 * jitter) - jitter


def test_reset_peer_resets_even_if_removed_once_data_came() -> None:
    async def scenario() -> tuple[int, list[bytes]]:
        reset = _runtime("reset_peer", timeout=200)
        out = _Collect()
        waiting = asyncio.ensure_future(reset.pipe(Chunk(b"data", 0.0), out))
        await asyncio.sleep(0)  # it has the data and waits
        reset.detached(0)  # removed meanwhile: Toxiproxy's bare time.After waits on
        await asyncio.wait_for(waiting, IO_TIMEOUT)
        return reset.link.resets, out.chunks

    assert asyncio.run(scenario()) == (1, [])  # reset, and the data was dropped
