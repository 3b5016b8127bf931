#!/usr/bin/env python3
"""Set up the emulated WAN in a Toxiproxy server from a JSON file; safe to run again.

    python deploy/toxiproxy_init.py [--api http://toxiproxy:8474] [--config toxiproxy.json]

The file (``toxiproxy.json`` next to this script by default) is a list of proxies in
the shape Toxiproxy's ``GET /proxies/{name}`` returns: ``name``, ``listen``,
``upstream``, ``enabled`` and ``toxics`` (``name``, ``type``, ``stream``,
``toxicity``, ``attributes``). For each proxy this script

* creates it (``POST /proxies``) if it is missing; updates it
  (``POST /proxies/{name}``) if its upstream or listen port differ or it is
  disabled; otherwise leaves it, and the connections through it, alone;
* creates each toxic (``POST /proxies/{name}/toxics``) if missing, updates its
  attributes and toxicity (``POST /proxies/{name}/toxics/{toxic}``) if they
  differ, and deletes and recreates it if its type or stream differ. Toxics that
  are not in the file are left alone.

It first waits (``--timeout`` seconds) for the API to answer ``GET /version``.
Standard library only, so it runs in the hubspoke image or any Python 3 image.
Exit status 0 when the server matches the file, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

DEFAULT_API = "http://toxiproxy:8474"
DEFAULT_CONFIG = Path(__file__).resolve().with_name("toxiproxy.json")


class InitError(Exception):
    """The server refused a change or could not be reached."""


def call(api: str, method: str, path: str, body: Any = None,
         timeout: float = 10.0) -> tuple[int, Any]:
    """One API request; returns (status, decoded JSON body or text or None)."""
    data = None if body is None else json.dumps(body).encode()
    headers = {"Content-Type": "application/json"} if data is not None else {}
    request = urllib.request.Request(api + path, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as reply:
            status, raw = reply.status, reply.read()
    except urllib.error.HTTPError as exc:
        status, raw = exc.code, exc.read()
    text = raw.decode("utf-8", "replace").strip()
    if not text:
        return status, None
    try:
        return status, json.loads(text)
    except ValueError:
        return status, text


def expect(reply: tuple[int, Any], what: str, ok: tuple[int, ...] = (200, 201, 204)) -> Any:
    status, payload = reply
    if status not in ok:
        raise InitError(f"{what}: HTTP {status}: {payload}")
    return payload


def wait_for_api(api: str, timeout: float) -> str:
    """Poll ``GET /version`` until it answers 200; return the version."""
    deadline = time.monotonic() + timeout
    last = "no answer"
    while True:
        try:
            status, payload = call(api, "GET", "/version", timeout=2.0)
            if status == 200:
                if isinstance(payload, dict):
                    return str(payload.get("version", "?"))
                return str(payload)
            last = f"HTTP {status}"
        except (urllib.error.URLError, OSError) as exc:
            last = str(exc)
        if time.monotonic() >= deadline:
            raise InitError(f"Toxiproxy API {api} not ready after {timeout:g} s ({last})")
        time.sleep(0.5)


def _port(hostport: str) -> int:
    return int(hostport.rsplit(":", 1)[1])


def _quote(name: str) -> str:
    return urllib.parse.quote(name, safe="")


def ensure_proxy(api: str, spec: dict[str, Any]) -> str:
    name = spec["name"]
    wanted = {"name": name, "listen": spec["listen"], "upstream": spec["upstream"],
              "enabled": bool(spec.get("enabled", True))}
    status, current = call(api, "GET", f"/proxies/{_quote(name)}")
    if status == 404:
        expect(call(api, "POST", "/proxies", wanted), f"create proxy {name}")
        return "created"
    expect((status, current), f"read proxy {name}", ok=(200,))
    # Toxiproxy reports the address it bound ("[::]:8666" for "0.0.0.0:8666"),
    # so compare ports; port 0 in the file means "any port".
    same = (
        current.get("upstream") == wanted["upstream"]
        and (_port(wanted["listen"]) in (0, _port(current.get("listen", ":0"))))
        and bool(current.get("enabled")) == wanted["enabled"]
    )
    if same:
        return "unchanged"
    body = {k: v for k, v in wanted.items() if k != "name"}
    expect(call(api, "POST", f"/proxies/{_quote(name)}", body), f"update proxy {name}")
    return "updated"


def ensure_toxic(api: str, proxy: str, spec: dict[str, Any]) -> str:
    name = spec["name"]
    base = f"/proxies/{_quote(proxy)}/toxics"
    wanted = {"name": name, "type": spec["type"], "stream": spec.get("stream", "downstream"),
              "toxicity": float(spec.get("toxicity", 1.0)),
              "attributes": dict(spec.get("attributes", {}))}
    status, current = call(api, "GET", f"{base}/{_quote(name)}")
    if status == 200 and isinstance(current, dict):
        if current.get("type") == wanted["type"] and current.get("stream") == wanted["stream"]:
            attributes = current.get("attributes") or {}
            same = (
                all(attributes.get(k) == v for k, v in wanted["attributes"].items())
                and float(current.get("toxicity", 1.0)) == wanted["toxicity"]
            )
            if same:
                return "unchanged"
            body = {"attributes": wanted["attributes"], "toxicity": wanted["toxicity"]}
            expect(call(api, "POST", f"{base}/{_quote(name)}", body),
                   f"update toxic {name} on {proxy}")
            return "updated"
        # Type and stream cannot be changed in place.
        expect(call(api, "DELETE", f"{base}/{_quote(name)}"), f"delete toxic {name} on {proxy}")
        expect(call(api, "POST", base, wanted), f"create toxic {name} on {proxy}")
        return "replaced"
    if status != 404:
        expect((status, current), f"read toxic {name} on {proxy}", ok=(200,))
    expect(call(api, "POST", base, wanted), f"create toxic {name} on {proxy}")
    return "created"


def apply(api: str, proxies: list[dict[str, Any]]) -> None:
    for spec in proxies:
        outcome = ensure_proxy(api, spec)
        print(f"proxy {spec['name']} ({spec['listen']} -> {spec['upstream']}): {outcome}",
              flush=True)
        for toxic in spec.get("toxics", []):
            outcome = ensure_toxic(api, spec["name"], toxic)
            print(f"  toxic {toxic['name']} ({toxic['type']} {toxic.get('stream', 'downstream')}"
                  f" {json.dumps(toxic.get('attributes', {}), sort_keys=True)}): {outcome}",
                  flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--api", default=os.environ.get("TOXIPROXY_URL", DEFAULT_API),
                        help="Toxiproxy API base URL [env TOXIPROXY_URL] (default: %(default)s)")
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG,
                        help="JSON list of proxies and their toxics (default: %(default)s)")
    parser.add_argument("--timeout", type=float, default=60.0,
                        help="seconds to wait for the API to come up (default: %(default)s)")
    args = parser.parse_args(argv)
    api = args.api.rstrip("/")
    try:
        proxies = json.loads(args.config.read_text())
        if not isinstance(proxies, list):
            raise InitError(f"{args.config}: expected a JSON list of proxies")
        version = wait_for_api(api, args.timeout)
        print(f"Toxiproxy {version} at {api}", flush=True)
        apply(api, proxies)
    except (InitError, OSError, ValueError, KeyError) as exc:
        print(f"toxiproxy_init: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
