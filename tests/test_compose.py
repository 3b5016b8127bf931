"""The container deployment: docker-compose.yml, the Dockerfile and deploy/.

No Docker engine is needed: the compose file is checked as data (and with
``docker-compose config -q`` when that binary is installed), the healthcheck
commands are run against a local HTTP server, and deploy/toxiproxy_init.py is
run, twice, against the project's Toxiproxy stand-in. The monitoring side
(Prometheus, Grafana, the provisioned dashboard) is checked the same way, and every
metric the dashboard queries is looked up in the /metrics of a real hub and spoke.
"""

from __future__ import annotations

import contextlib
import http.server
import json
import re
import shlex
import shutil
import socket
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from loadtest.procs import start_process
from loadtest.toxiproxy_standin import run_in_subprocess
from protocol.sizes import parse_size

ROOT = Path(__file__).resolve().parent.parent
COMPOSE_FILE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
INIT_SCRIPT = ROOT / "deploy" / "toxiproxy_init.py"
INIT_CONFIG = ROOT / "deploy" / "toxiproxy.json"
IMAGE_DEPLOY_DIR = "/opt/hubspoke/deploy"  # where the Dockerfile puts deploy/ files

HUB_PORT = 8700
SPOKE_PORT = 8701
TOXIPROXY_API_PORT = 8474
PROXY_PORT = 8666
WAN_LATENCY_MS = 60


# --------------------------------------------------------------------------- helpers


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    data = yaml.safe_load(COMPOSE_FILE.read_text())
    assert isinstance(data, dict), "docker-compose.yml is not a mapping"
    return data


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    found = compose.get("services")
    assert isinstance(found, dict), "docker-compose.yml has no services"
    return found


@pytest.fixture(scope="module")
def proxies() -> list[dict[str, Any]]:
    data = json.loads(INIT_CONFIG.read_text())
    assert isinstance(data, list)
    return data


def env_default(text: str) -> str:
    """``${VAR:-default}`` → ``default`` (what compose uses with VAR unset)."""
    return re.sub(r"\$\{[A-Za-z_][A-Za-z0-9_]*(?::?-([^}]*))?\}", lambda m: m.group(1) or "", text)


def command(service: dict[str, Any]) -> list[str]:
    cmd = service.get("command")
    assert cmd, "service has no command"
    return [env_default(str(part)) for part in (shlex.split(cmd) if isinstance(cmd, str) else cmd)]


def flag(cmd: list[str], name: str) -> str:
    """The value of ``--name value`` or ``--name=value`` in ``cmd``."""
    for i, part in enumerate(cmd):
        if part == name:
            assert i + 1 < len(cmd), f"{name} has no value in {cmd}"
            return cmd[i + 1]
        if part.startswith(name + "="):
            return part.split("=", 1)[1]
    raise AssertionError(f"{name} not in {cmd}")


def published(service: dict[str, Any]) -> dict[int, int]:
    """Published host port → container port, from short or long port syntax."""
    ports: dict[int, int] = {}
    for entry in service.get("ports", []):
        if isinstance(entry, dict):
            if entry.get("published") is not None:
                ports[int(env_default(str(entry["published"])))] = int(entry["target"])
            continue
        parts = env_default(str(entry)).split("/")[0].split(":")
        if len(parts) >= 2:  # [ip:]host:container; a bare port is not published on a known port
            ports[int(parts[-2])] = int(parts[-1])
    return ports


def volume_mounts(service: dict[str, Any]) -> dict[str, str]:
    """Container path → source (volume name or host path)."""
    mounts: dict[str, str] = {}
    for entry in service.get("volumes", []):
        if isinstance(entry, dict):
            mounts[entry["target"]] = env_default(str(entry.get("source", "")))
        else:
            source, target, *_ = env_default(str(entry)).split(":")
            mounts[target] = source
    return mounts


def condition(service: dict[str, Any], dependency: str) -> str:
    depends = service.get("depends_on", {})
    assert dependency in depends, f"no depends_on {dependency}"
    if isinstance(depends, list):
        return "service_started"
    return str((depends[dependency] or {}).get("condition", "service_started"))


def uses_our_image(service: dict[str, Any]) -> bool:
    build = service.get("build")
    context = build.get("context", ".") if isinstance(build, dict) else build
    return context in (".", "./")


def proxy_named(proxies: list[dict[str, Any]], name: str) -> dict[str, Any]:
    matches = [p for p in proxies if p.get("name") == name]
    assert len(matches) == 1, f"expected one proxy {name!r} in {INIT_CONFIG}"
    return matches[0]


# --------------------------------------------------------------------------- compose file


def test_services_exist(services: dict[str, dict[str, Any]]) -> None:
    assert {"hub", "toxiproxy", "toxiproxy-init", "spoke"} <= set(services)


def test_ports_published(services: dict[str, dict[str, Any]]) -> None:
    assert published(services["hub"]).get(HUB_PORT) == HUB_PORT
    assert published(services["spoke"]).get(SPOKE_PORT) == SPOKE_PORT
    assert published(services["toxiproxy"]).get(TOXIPROXY_API_PORT) == TOXIPROXY_API_PORT
    # The WAN end of the proxy is only for the spoke, inside the compose network.
    assert PROXY_PORT not in published(services["toxiproxy"]).values()


def test_toxiproxy_image(services: dict[str, dict[str, Any]]) -> None:
    image = services["toxiproxy"]["image"]
    repo, _, tag = image.rpartition(":")
    assert repo == "ghcr.io/shopify/toxiproxy"
    assert re.fullmatch(r"\d+\.\d+\.\d+", tag), f"toxiproxy image should be pinned: {image}"


def test_hub_serves_data_on_its_port(services: dict[str, dict[str, Any]]) -> None:
    hub = services["hub"]
    assert uses_our_image(hub)
    cmd = command(hub)
    assert cmd[:4] == ["python", "-m", "hub", "serve"]
    assert flag(cmd, "--root") == "/data"
    assert flag(cmd, "--host") == "0.0.0.0"
    assert int(flag(cmd, "--port")) == HUB_PORT
    assert "/data" in volume_mounts(hub)


def test_hub_data_comes_from_the_dataset_step(
    compose: dict[str, Any], services: dict[str, dict[str, Any]]
) -> None:
    dataset, hub = services["dataset"], services["hub"]
    cmd = command(dataset)
    assert cmd[:3] == ["python", "-m", "loadtest.dataset"]
    out = flag(cmd, "--out")
    assert out == "/data" or out.startswith("/data/")
    assert int(flag(cmd, "--shards")) > 0
    assert parse_size(flag(cmd, "--shard-size")) > 0
    # Same source for both (the named volume by default), hub started after it is written.
    source = volume_mounts(dataset)["/data"]
    assert volume_mounts(hub)["/data"] == source
    assert source in (compose.get("volumes") or {}), f"{source} is not a declared named volume"
    assert condition(hub, "dataset") == "service_completed_successfully"


def test_spoke_reaches_the_hub_through_toxiproxy(
    services: dict[str, dict[str, Any]], proxies: list[dict[str, Any]]
) -> None:
    spoke = services["spoke"]
    assert uses_our_image(spoke)
    cmd = command(spoke)
    assert cmd[:4] == ["python", "-m", "spoke", "serve"]
    hub_url = urlsplit(flag(cmd, "--hub"))
    assert hub_url.scheme == "http"
    assert hub_url.hostname == "toxiproxy"
    assert hub_url.port == PROXY_PORT
    # ...which is where the init step makes proxy `hub` listen.
    listen = proxy_named(proxies, "hub")["listen"]
    assert int(listen.rsplit(":", 1)[1]) == hub_url.port
    assert flag(cmd, "--cache-dir") == "/cache"
    assert parse_size(flag(cmd, "--capacity")) >= 1 << 30
    assert flag(cmd, "--host") == "0.0.0.0"
    assert int(flag(cmd, "--port")) == SPOKE_PORT


def test_spoke_serves_s3_on_its_own_port(services: dict[str, dict[str, Any]]) -> None:
    spoke = services["spoke"]
    s3_port = int(flag(command(spoke), "--s3-port"))
    assert s3_port != SPOKE_PORT
    assert published(spoke).get(s3_port) == s3_port


def test_spoke_cache_on_a_named_volume(
    compose: dict[str, Any], services: dict[str, dict[str, Any]]
) -> None:
    source = volume_mounts(services["spoke"])["/cache"]
    assert not source.startswith((".", "/", "~")), f"/cache is a bind mount: {source}"
    assert source in (compose.get("volumes") or {}), f"{source} is not a declared named volume"


def test_startup_order(services: dict[str, dict[str, Any]]) -> None:
    spoke, init = services["spoke"], services["toxiproxy-init"]
    assert condition(spoke, "hub") == "service_healthy"
    assert condition(spoke, "toxiproxy-init") == "service_completed_successfully"
    assert condition(init, "toxiproxy") in ("service_started", "service_healthy")
    assert init.get("restart", "no") == "no"


def test_init_step_runs_the_deploy_script(services: dict[str, dict[str, Any]]) -> None:
    init = services["toxiproxy-init"]
    assert uses_our_image(init)
    cmd = command(init)
    assert cmd[:2] == ["python", f"{IMAGE_DEPLOY_DIR}/{INIT_SCRIPT.name}"]
    assert flag(cmd, "--config") == f"{IMAGE_DEPLOY_DIR}/{INIT_CONFIG.name}"
    api = urlsplit(flag(cmd, "--api"))
    assert (api.hostname, api.port) == ("toxiproxy", TOXIPROXY_API_PORT)
    dockerfile = DOCKERFILE.read_text()
    copy = re.search(r"^COPY\s+(?!--from)(.*deploy/.*)$", dockerfile, re.MULTILINE)
    assert copy is not None, "the Dockerfile does not copy deploy/ into the image"
    sources, dest = copy.group(1).split()[:-1], copy.group(1).split()[-1]
    assert dest.rstrip("/") == IMAGE_DEPLOY_DIR
    assert {f"deploy/{INIT_SCRIPT.name}", f"deploy/{INIT_CONFIG.name}"} <= set(sources)


def test_init_config_is_a_60ms_wan_in_front_of_the_hub(
    services: dict[str, dict[str, Any]], proxies: list[dict[str, Any]]
) -> None:
    proxy = proxy_named(proxies, "hub")
    assert proxy["upstream"] == f"hub:{HUB_PORT}"
    upstream_host, upstream_port = proxy["upstream"].rsplit(":", 1)
    assert upstream_host in services
    assert int(flag(command(services[upstream_host]), "--port")) == int(upstream_port)
    listen_host, listen_port = proxy["listen"].rsplit(":", 1)
    assert listen_host in ("0.0.0.0", "", "[::]"), "other containers must reach the proxy"
    assert int(listen_port) == PROXY_PORT
    assert proxy.get("enabled", True) is True
    latency = [t for t in proxy["toxics"] if t["type"] == "latency"]
    assert len(latency) == 1
    toxic = latency[0]
    assert toxic["name"] == "wan_latency"
    assert toxic["stream"] == "downstream"
    assert toxic.get("toxicity", 1.0) == 1.0
    assert toxic["attributes"] == {"latency": WAN_LATENCY_MS, "jitter": 0}


HEALTHCHECKED = [("hub", HUB_PORT), ("spoke", SPOKE_PORT)]


@pytest.mark.parametrize(("name", "port"), HEALTHCHECKED)
def test_healthcheck_hits_healthz(
    services: dict[str, dict[str, Any]], name: str, port: int
) -> None:
    check = services[name].get("healthcheck")
    assert check, f"{name} has no healthcheck"
    assert not check.get("disable", False)
    test = check["test"]
    assert test[:3] == ["CMD", "python", "-c"], "python -c, since the slim image has no curl"
    assert f"http://127.0.0.1:{port}/healthz" in test[3]
    assert int(check.get("retries", 3)) >= 1


class _Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        status = self.server.status if self.path == "/healthz" else 404  # type: ignore[attr-defined]
        self.send_response(status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: the test reads the statuses, not the stand-in's log."""


@contextlib.contextmanager
def health_server(status: int) -> Iterator[int]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Health)
    server.status = status  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@pytest.mark.parametrize(("name", "port"), HEALTHCHECKED)
def test_healthcheck_command_passes_and_fails(
    services: dict[str, dict[str, Any]], name: str, port: int
) -> None:
    code = services[name]["healthcheck"]["test"][3]
    for status, healthy in ((200, True), (503, False)):
        with health_server(status) as local_port:
            local = code.replace(f"127.0.0.1:{port}", f"127.0.0.1:{local_port}")
            run = subprocess.run([sys.executable, "-c", local], capture_output=True, timeout=30,
                                 check=False)
        assert (run.returncode == 0) is healthy, (status, run.stderr)


def test_docker_compose_config_is_valid() -> None:
    binary = shutil.which("docker-compose")
    assert binary is not None, "docker-compose comes with `make test` (the Makefile's tools)"
    run = subprocess.run([binary, "-f", str(COMPOSE_FILE), "config", "-q"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60, check=False)
    assert run.returncode == 0, run.stderr


# --------------------------------------------------------------------------- image


def test_dockerfile_builds_a_small_non_root_image() -> None:
    text = DOCKERFILE.read_text()
    stages = re.findall(r"^FROM\s+(\S+)", text, re.MULTILINE)
    assert stages, "no FROM"
    assert stages[-1] == "python:3.11-slim"
    install = re.search(r"pip install\s+(.*)$", text, re.MULTILINE)
    assert install is not None, "the project is not pip-installed"
    assert "[test]" not in install.group(1) and "-e" not in install.group(1).split()
    users = re.findall(r"^USER\s+(\S+)", text, re.MULTILINE)
    assert users, "the image runs as root"
    assert users[-1].split(":")[0] not in ("root", "0")
    ignored = {line.strip().rstrip("/") for line in DOCKERIGNORE.read_text().splitlines()}
    assert {".venv", ".git", "tests", "demo-data", "data"} <= ignored


# --------------------------------------------------------------------------- the init script


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _api(url: str, method: str, path: str, body: Any = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url + path, data=data, method=method)
    with urllib.request.urlopen(request, timeout=10) as reply:
        return json.loads(reply.read())


def _run_init(api_url: str, config: Path, timeout: str = "15") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(INIT_SCRIPT), "--api", api_url, "--config", str(config),
         "--timeout", timeout],
        capture_output=True, text=True, timeout=60, check=False,
    )


def test_init_script_sets_up_the_wan_and_is_idempotent(
    tmp_path: Path, proxies: list[dict[str, Any]]
) -> None:
    # The real file, with addresses that work on this machine.
    local = json.loads(json.dumps(proxies))
    proxy = proxy_named(local, "hub")
    proxy["listen"] = f"127.0.0.1:{_free_port()}"
    proxy["upstream"] = "127.0.0.1:9"
    config = tmp_path / "toxiproxy.json"
    config.write_text(json.dumps(local))

    with run_in_subprocess("127.0.0.1", 0) as api_url:
        first = _run_init(api_url, config)
        assert first.returncode == 0, first.stderr
        state = _api(api_url, "GET", "/proxies/hub")
        assert state["upstream"] == "127.0.0.1:9"
        assert state["listen"] == proxy["listen"]
        assert state["enabled"] is True
        assert [(t["name"], t["type"], t["stream"], t["attributes"]) for t in state["toxics"]] == [
            ("wan_latency", "latency", "downstream", {"latency": WAN_LATENCY_MS, "jitter": 0})
        ]

        # Re-run: nothing is duplicated or recreated.
        second = _run_init(api_url, config)
        assert second.returncode == 0, second.stderr
        # ...and nothing is touched: a needless update restarts a real Toxiproxy's listener.
        outcomes = [line.rsplit(": ", 1)[1] for line in second.stdout.splitlines()[1:]]
        assert outcomes == ["unchanged", "unchanged"], second.stdout
        assert _api(api_url, "GET", "/proxies/hub") == state

        # Drift is put back.
        _api(api_url, "POST", "/proxies/hub/toxics/wan_latency", {"attributes": {"latency": 5}})
        _api(api_url, "POST", "/proxies/hub", {"enabled": False})
        third = _run_init(api_url, config)
        assert third.returncode == 0, third.stderr
        assert _api(api_url, "GET", "/proxies/hub") == state


def test_init_script_fails_when_toxiproxy_never_answers(tmp_path: Path) -> None:
    run = _run_init(f"http://127.0.0.1:{_free_port()}", INIT_CONFIG, timeout="1")
    assert run.returncode != 0
    assert "not ready" in run.stderr


# --------------------------------------------------------------------------- monitoring

PROMETHEUS_PORT = 9090
GRAFANA_PORT = 3000
PROMETHEUS_CONFIG = ROOT / "deploy" / "prometheus" / "prometheus.yml"
GRAFANA_DIR = ROOT / "deploy" / "grafana"
GRAFANA_DATASOURCE = GRAFANA_DIR / "provisioning" / "datasources" / "prometheus.yml"
GRAFANA_PROVIDER = GRAFANA_DIR / "provisioning" / "dashboards" / "hubspoke.yml"
DASHBOARD = GRAFANA_DIR / "dashboards" / "hubspoke.json"
GRAFANA_PROVISIONING_PATH = "/etc/grafana/provisioning"  # the image's default

# What issue 4 asks the dashboard to show, as the series it has to read.
REQUIRED_METRICS = {
    "spoke_served_hit_bytes_total", "spoke_served_miss_bytes_total",  # throughput, byte hits
    "spoke_cache_hits_total", "spoke_cache_misses_total",  # hit ratio
    "spoke_read_seconds_bucket",  # p99 read latency by cache outcome
    "spoke_hub_bytes_total", "hub_bytes_sent_total",  # hub egress
    "spoke_hub_fetch_seconds_bucket", "spoke_hub_fetches_in_flight",
    "spoke_cache_used_bytes", "spoke_cache_capacity_bytes", "spoke_evictions_total",
    "spoke_breaker_state", "spoke_warm_bytes_done", "spoke_warm_bytes_total",
    "spoke_prefetch_accuracy",
}


def published_on(service: dict[str, Any]) -> dict[int, tuple[str, int]]:
    """Container port → (host address, host port); address "" when on all interfaces."""
    ports: dict[int, tuple[str, int]] = {}
    for entry in service.get("ports", []):
        if isinstance(entry, dict):
            if entry.get("published") is not None:
                ports[int(entry["target"])] = (
                    str(entry.get("host_ip", "")), int(env_default(str(entry["published"])))
                )
            continue
        parts = env_default(str(entry)).split("/")[0].split(":")
        if len(parts) == 3:
            ports[int(parts[2])] = (parts[0], int(parts[1]))
        elif len(parts) == 2:
            ports[int(parts[1])] = ("", int(parts[0]))
    return ports


def bind_mounts(service: dict[str, Any]) -> dict[str, Path]:
    """Container path → host path (resolved against the compose file) of bind mounts."""
    return {
        target: (ROOT / source).resolve()
        for target, source in volume_mounts(service).items()
        if source.startswith((".", "/"))
    }


def environment(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {str(k): env_default(str(v)) for k, v in env.items()}


def container_file(service: dict[str, Any], path: str) -> Path | None:
    """The host file a bind mount of ``service`` puts at container ``path``."""
    for target, source in bind_mounts(service).items():
        if path == target:
            return source
        if path.startswith(target.rstrip("/") + "/"):
            return source / path[len(target.rstrip("/")) + 1:]
    return None


def image_tag(service: dict[str, Any], repo: str) -> str:
    image = str(service.get("image", ""))
    name, _, tag = image.rpartition(":")
    assert name == repo, f"expected image {repo}, got {image}"
    return tag


@pytest.fixture(scope="module")
def prometheus_config() -> dict[str, Any]:
    data = yaml.safe_load(PROMETHEUS_CONFIG.read_text())
    assert isinstance(data, dict)
    return data


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    data = json.loads(DASHBOARD.read_text())
    assert isinstance(data, dict)
    return data


def dashboard_exprs(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    """(panel title, PromQL) for every query of every panel, rows included."""
    found = []
    stack = list(dashboard["panels"])
    while stack:
        panel = stack.pop()
        stack.extend(panel.get("panels", []))
        found.extend((panel["title"], t["expr"]) for t in panel.get("targets", []))
    return found


_PROMQL_TOKEN = re.compile(
    r"(?:\d+(?:ms|[smhdwy]))+"  # durations (offset 1m30s)
    r"|\d+(?:\.\d*)?(?:[eE][+-]?\d+)?"  # and numbers (0.99, 1e6) are not names
    r"|([A-Za-z_:][A-Za-z0-9_:]*)(\s*\()?"  # a name; followed by "(" it is a function
)
_PROMQL_KEYWORDS = {"and", "or", "unless", "bool", "offset", "inf", "nan", "by", "without",
                    "on", "ignoring", "group_left", "group_right"}
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)")


def promql_metrics(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (not functions, labels or keywords)."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # label values
    text = re.sub(r"\{[^}]*\}", "", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", "", text)  # range selectors, $__rate_interval included
    text = _GROUPING.sub("", text)
    names = set()
    for match in _PROMQL_TOKEN.finditer(text):
        name, call = match.groups()
        if name and not call and name.lower() not in _PROMQL_KEYWORDS:
            names.add(name)
    return names


def test_promql_metrics_extracts_only_metric_names() -> None:
    expr = ('histogram_quantile(0.99, sum by (le, cache) '
            '(rate(spoke_read_seconds_bucket{cache!="hit"}[$__rate_interval]))) '
            '/ on() group_left max(spoke_breaker_state offset 1m) * 1e3 > bool 0')
    assert promql_metrics(expr) == {"spoke_read_seconds_bucket", "spoke_breaker_state"}


@dataclass
class Exported:
    """What a real hub and spoke put on /metrics: sample names, their types and labels."""

    types: dict[str, str]  # sample name → family type (counter, gauge, histogram)
    labels: dict[str, set[str]]  # sample name → label names seen on it


def _read(url: str, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    request = urllib.request.Request(url, headers=headers or {})
    with urllib.request.urlopen(request, timeout=30) as reply:
        return reply.status, reply.read()


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Exported:
    root = tmp_path_factory.mktemp("metrics-hub-root")
    (root / "ds").mkdir()
    data = bytes(range(256)) * 1024  # 256 KiB: four chunks of 64 KiB
    (root / "ds" / "shard.bin").write_bytes(data)
    logs = str(tmp_path_factory.mktemp("metrics-logs"))
    cache = tmp_path_factory.mktemp("metrics-cache")
    types: dict[str, str] = {}
    labels: dict[str, set[str]] = {}
    hub = start_process("hub", ["--root", str(root), "--chunk-size", "64KiB"], log_dir=logs)
    try:
        spoke = start_process("spoke", ["--hub", hub.url, "--cache-dir", str(cache),
                                        "--capacity", "64MiB"], log_dir=logs)
        try:
            # A miss, a hit and a partial hit, so every histogram has samples.
            url = f"{spoke.url}/objects/ds/shard.bin"
            assert _read(url, {"Range": "bytes=0-99"}) == (206, data[:100])
            assert _read(url) == (200, data)
            assert _read(url, {"Range": "bytes=100-199"}) == (206, data[100:200])
            for server in (hub, spoke):
                status, body = _read(f"{server.url}/metrics")
                assert status == 200
                for family in text_string_to_metric_families(body.decode()):
                    for sample in family.samples:
                        types[sample.name] = family.type
                        labels.setdefault(sample.name, set()).update(sample.labels)
        finally:
            spoke.stop()
    finally:
        hub.stop()
    return Exported(types, labels)


def test_monitoring_services_exist(services: dict[str, dict[str, Any]]) -> None:
    assert {"prometheus", "grafana"} <= set(services)


def test_monitoring_images_are_pinned(services: dict[str, dict[str, Any]]) -> None:
    prometheus = image_tag(services["prometheus"], "prom/prometheus")
    assert re.fullmatch(r"v\d+\.\d+\.\d+", prometheus), f"prometheus not pinned: {prometheus}"
    grafana = image_tag(services["grafana"], "grafana/grafana-oss")
    assert re.fullmatch(r"\d+\.\d+\.\d+", grafana), f"grafana not pinned: {grafana}"


@pytest.mark.parametrize(("name", "port"), [("prometheus", PROMETHEUS_PORT),
                                            ("grafana", GRAFANA_PORT)])
def test_monitoring_ports_on_loopback_only(
    services: dict[str, dict[str, Any]], name: str, port: int
) -> None:
    assert published_on(services[name]) == {port: ("127.0.0.1", port)}


def test_prometheus_runs_the_repository_config(services: dict[str, dict[str, Any]]) -> None:
    prometheus = services["prometheus"]
    path = "/etc/prometheus/prometheus.yml"  # the image's default
    if prometheus.get("command"):
        path = flag(command(prometheus), "--config.file")
    assert container_file(prometheus, path) == PROMETHEUS_CONFIG.resolve()


def test_prometheus_scrapes_hub_and_spoke(
    services: dict[str, dict[str, Any]], prometheus_config: dict[str, Any]
) -> None:
    default_interval = prometheus_config.get("global", {}).get("scrape_interval", "1m")
    scraped: dict[str, str] = {}
    for job in prometheus_config["scrape_configs"]:
        assert job.get("metrics_path", "/metrics") == "/metrics"
        assert job.get("scheme", "http") == "http"
        for static in job.get("static_configs", []):
            for target in static["targets"]:
                scraped[target] = str(job.get("scrape_interval", default_interval))
    for name, port in HEALTHCHECKED:
        target = f"{name}:{port}"
        assert target in scraped, f"{target} is not scraped"
        # ...and it is where that service listens inside the compose network.
        assert int(flag(command(services[name]), "--port")) == port
        interval = re.fullmatch(r"(\d+)s", scraped[target])
        assert interval is not None and 1 <= int(interval.group(1)) <= 2, scraped[target]


def test_grafana_is_provisioned_from_the_repository(services: dict[str, dict[str, Any]]) -> None:
    grafana = services["grafana"]
    env = environment(grafana)
    assert env.get("GF_AUTH_ANONYMOUS_ENABLED") == "true"
    assert env.get("GF_AUTH_ANONYMOUS_ORG_ROLE") == "Viewer"
    provisioning = env.get("GF_PATHS_PROVISIONING", GRAFANA_PROVISIONING_PATH)
    assert container_file(grafana, provisioning) == (GRAFANA_DIR / "provisioning").resolve()

    datasources = yaml.safe_load(GRAFANA_DATASOURCE.read_text())["datasources"]
    assert [(d["type"], d["url"]) for d in datasources] == [
        ("prometheus", f"http://prometheus:{PROMETHEUS_PORT}")
    ]
    assert "prometheus" in services

    providers = yaml.safe_load(GRAFANA_PROVIDER.read_text())["providers"]
    assert len(providers) == 1 and providers[0]["type"] == "file"
    folder = container_file(grafana, providers[0]["options"]["path"])
    assert folder is not None and (folder / DASHBOARD.name).resolve() == DASHBOARD.resolve()
    assert condition(grafana, "prometheus") in ("service_started", "service_healthy")


def test_dashboard_is_a_grafana_dashboard(dashboard: dict[str, Any]) -> None:
    assert dashboard["uid"] == "hubspoke"
    assert dashboard["title"]
    assert isinstance(dashboard["schemaVersion"], int)
    assert dashboard["refresh"] == "5s"
    assert dashboard["time"] == {"from": "now-15m", "to": "now"}
    panels = dashboard["panels"]
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), "duplicate panel ids"
    datasource_uids = {d.get("uid") for d in
                       yaml.safe_load(GRAFANA_DATASOURCE.read_text())["datasources"]}
    for panel in panels:
        pos = panel["gridPos"]
        assert pos["x"] >= 0 and pos["w"] > 0 and pos["x"] + pos["w"] <= 24, panel["title"]
        if panel["type"] == "row":
            continue
        assert panel["targets"], f"{panel['title']} has no query"
        for t in panel["targets"]:
            source = t.get("datasource", panel.get("datasource"))
            assert source["type"] == "prometheus" and source["uid"] in datasource_uids
            assert t["expr"].count("(") == t["expr"].count(")"), t["expr"]


def test_dashboard_queries_only_metrics_the_servers_export(
    dashboard: dict[str, Any], exported: Exported
) -> None:
    used: set[str] = set()
    for title, expr in dashboard_exprs(dashboard):
        names = promql_metrics(expr)
        assert names, f"{title}: no metric in {expr}"
        unknown = names - set(exported.types)
        assert not unknown, f"{title}: {sorted(unknown)} not exported by hub or spoke ({expr})"
        used |= names
        # rate() & co. only make sense over counters (spoke_warm_bytes_total is a gauge).
        for name in re.findall(r"\b(?:rate|irate|increase)\(\s*([A-Za-z_:][\w:]*)", expr):
            assert exported.types[name] in ("counter", "histogram"), f"{title}: rate({name})"
        # Quantiles come from buckets, aggregated by le; other labels must exist on them.
        for grouping in _GROUPING.findall(expr):
            for label in filter(None, (part.strip() for part in grouping.split(","))):
                assert any(label in exported.labels[n] for n in names), f"{title}: {label}"
        if "_bucket" in expr:
            assert "histogram_quantile(" in expr
            assert any("le" in (part.strip() for part in g.split(","))
                       for g in _GROUPING.findall(expr)), f"{title}: not aggregated by le"
    assert used >= REQUIRED_METRICS, f"not on the dashboard: {sorted(REQUIRED_METRICS - used)}"


# --------------------------------------------------------------------------- object store profile

OBJSTORE = ("objstore", "objstore-seed", "hub-s3")
SEAWEED_CONFIG = ROOT / "deploy" / "seaweedfs" / "s3.json"


def test_the_object_store_services_are_a_profile_of_their_own(
    services: dict[str, dict[str, Any]]
) -> None:
    for name in OBJSTORE:
        assert services[name].get("profiles") == ["objstore"], name
    # The directory hub stays what a plain `up` starts.
    for name in ("hub", "spoke", "dataset", "toxiproxy"):
        assert "profiles" not in services[name], name
    assert flag(command(services["hub"]), "--root") == "/data"


def test_the_store_is_a_pinned_seaweedfs_with_the_repositorys_s3_identities(
    services: dict[str, dict[str, Any]]
) -> None:
    store = services["objstore"]
    repo, _, tag = store["image"].rpartition(":")
    assert repo == "chrislusf/seaweedfs" and re.fullmatch(r"\d+\.\d+", tag), store["image"]
    cmd = command(store)
    assert cmd[0] == "server" and "-s3" in cmd and "-s3.port=8333" in cmd
    config_in_container = next(p.split("=", 1)[1] for p in cmd if p.startswith("-s3.config="))
    assert volume_mounts(store)[config_in_container] == "./deploy/seaweedfs/s3.json"
    assert published(store) == {8333: 8333}
    assert all(str(p).startswith("127.0.0.1:") for p in store["ports"])  # loopback only
    identities = json.loads(SEAWEED_CONFIG.read_text())["identities"]
    keys = {(c["accessKey"], c["secretKey"]) for i in identities for c in i["credentials"]}
    for name in ("objstore-seed", "hub-s3"):
        env = services[name]["environment"]
        assert (env["AWS_ACCESS_KEY_ID"], env["AWS_SECRET_ACCESS_KEY"]) in keys, name


def test_the_s3_hub_serves_the_seeded_bucket_after_the_seed(
    services: dict[str, dict[str, Any]]
) -> None:
    seed, hub = services["objstore-seed"], services["hub-s3"]
    assert uses_our_image(seed) and uses_our_image(hub)
    assert condition(seed, "dataset") == "service_completed_successfully"
    assert condition(hub, "objstore-seed") == "service_completed_successfully"
    cmd = command(hub)
    bucket = flag(command(seed), "--bucket")
    assert flag(cmd, "--root") == f"s3://{bucket}/"
    assert flag(cmd, "--s3-endpoint") == flag(command(seed), "--endpoint") == "http://objstore:8333"
    # The index lives on a volume, below the directory the image gives the hub's user.
    assert flag(cmd, "--index-dir").startswith("/cache/")
    assert volume_mounts(hub)["/cache"] == "hub-index"
    assert published(hub) == {8710: HUB_PORT}


def _with(cmd: list[str], name: str, value: str) -> list[str]:
    i = cmd.index(name)
    return [*cmd[:i + 1], value, *cmd[i + 2:]]


def test_the_profiles_seed_and_hub_commands_work_against_a_real_store(
    services: dict[str, dict[str, Any]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The two commands as compose runs them, against rclone serve s3 in place of
    SeaweedFS: the seed uploads a directory, the hub then serves it byte-exact."""
    from loadtest.s3_stores import start_rclone_s3

    source = tmp_path / "data" / "dataset"
    source.mkdir(parents=True)
    shard = bytes(range(256)) * 1000
    (source / "shard-00000.bin").write_bytes(shard)
    (tmp_path / "store").mkdir()
    store = start_rclone_s3(str(tmp_path / "store"), log_dir=str(tmp_path))
    try:
        env = {"AWS_ACCESS_KEY_ID": store.access_key, "AWS_SECRET_ACCESS_KEY": store.secret_key,
               "AWS_REGION": store.region, "PATH": "/usr/bin:/bin"}
        seed = _with(_with(command(services["objstore-seed"]), "--from", str(tmp_path / "data")),
                     "--endpoint", store.url)
        assert seed[:2] == ["python", "-m"]
        done = subprocess.run([sys.executable, *seed[1:]], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=120, check=False)
        assert done.returncode == 0, done.stderr
        hub_cmd = _with(_with(command(services["hub-s3"]), "--s3-endpoint", store.url),
                        "--index-dir", str(tmp_path / "index"))
        hub_cmd = _with(_with(hub_cmd, "--host", "127.0.0.1"), "--port", "0")
        assert hub_cmd[:4] == ["python", "-m", "hub", "serve"]
        for name, value in env.items():
            if name != "PATH":
                monkeypatch.setenv(name, value)  # start_process passes its environment on
        hub = start_process("hub", hub_cmd[4:], log_dir=str(tmp_path))
        try:
            with urllib.request.urlopen(f"{hub.url}/objects/dataset/shard-00000.bin",
                                        timeout=30) as reply:
                assert reply.read() == shard
        finally:
            hub.stop()
    finally:
        store.stop()
