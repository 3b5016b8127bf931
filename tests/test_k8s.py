"""The Kubernetes manifests (deploy/k8s), checked offline.

``kubectl kustomize deploy/k8s`` renders them (kubectl is a system tool: ``make tools``), the
render goes through ``kubernetes-validate --strict`` (it ships the API's JSON schemas, so no
cluster is needed), and the containers' command lines go through the hub's and the spoke's own
argument parsers, after the ``$(VAR)`` expansion the kubelet does. The rest checks the wiring
the schemas cannot see: the headless Service that ``--peers`` names, the probes on the port the
spoke listens on, the cache on the node's disk, the token files the Secret provides.
"""

from __future__ import annotations

import contextlib
import io
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from hub.config import parse_args as hub_parse_args
from spoke.config import config_from_args as spoke_config_from_args
from spoke.config import parse_args as spoke_parse_args

ROOT = Path(__file__).resolve().parent.parent
K8S = ROOT / "deploy" / "k8s"
COMPOSE_FILE = ROOT / "docker-compose.yml"
# The oldest API version the manifests claim (internalTrafficPolicy, Job TTLs are GA well
# before it), and a recent one; both ship with kubernetes-validate.
KUBERNETES_VERSIONS = ("1.30.0", "1.33.0")
# What the kubelet puts in the downward-API variables the manifests use, for the parse test.
FIELD_VALUES = {"status.podIP": "10.1.2.3", "status.hostIP": "10.1.2.3", "spec.nodeName": "gpu-7"}
NAMESPACE = "hubspoke"


def _tool(name: str) -> str:
    found = shutil.which(name) or shutil.which(name, path=str(Path(sys.executable).parent))
    assert found, f"{name} is not installed (make tools installs kubectl; the venv has the rest)"
    return found


def render() -> str:
    done = subprocess.run(
        [_tool("kubectl"), "kustomize", str(K8S)], capture_output=True, text=True, timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def validate(text: str, version: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [_tool("kubernetes-validate"), "--strict", "-k", version, "-"],
        input=text, capture_output=True, text=True, timeout=300, check=False,
    )


@pytest.fixture(scope="module")
def rendered() -> str:
    return render()


@pytest.fixture(scope="module")
def docs(rendered: str) -> list[dict[str, Any]]:
    loaded = [d for d in yaml.safe_load_all(rendered) if d]
    assert all(isinstance(d, dict) for d in loaded)
    return loaded


def find(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    matches = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(matches) == 1, f"expected one {kind}/{name}, found {len(matches)}"
    return matches[0]


def pod_spec(workload: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = workload["spec"]["template"]["spec"]
    return spec


def container(workload: dict[str, Any], name: str) -> dict[str, Any]:
    matches = [c for c in pod_spec(workload)["containers"] if c["name"] == name]
    assert len(matches) == 1
    return matches[0]


def expanded_argv(c: dict[str, Any]) -> list[str]:
    """The container's argv as the kubelet runs it: ``$(VAR)`` replaced from its env."""
    env: dict[str, str] = {}
    for var in c.get("env", []):
        if "value" in var:
            env[var["name"]] = var["value"]
        else:
            env[var["name"]] = FIELD_VALUES[var["valueFrom"]["fieldRef"]["fieldPath"]]
    argv = [*c.get("command", []), *c.get("args", [])]

    def expand(text: str) -> str:
        return re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env.get(m[1], m[0]), text)

    return [expand(a) for a in argv]


def flag(argv: list[str], name: str) -> str:
    assert argv.count(name) == 1, f"{name} given {argv.count(name)} times in {argv}"
    return argv[argv.index(name) + 1]


def parsed(parse: Callable[[list[str], dict[str, str]], Any], argv: list[str]) -> Any:
    """``parse(argv)``, failing the test with argparse's own message if it exits."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            return parse(argv, {})
    except SystemExit as exc:
        pytest.fail(f"{argv} does not parse (exit {exc.code}): {err.getvalue()}")


def module_argv(argv: list[str], module: str) -> list[str]:
    assert argv[:3] == ["python", "-m", module], argv
    return argv[3:]


def secret_paths(workload: dict[str, Any], secret: dict[str, Any]) -> Iterator[str]:
    """Every file path a container of ``workload`` sees from ``secret``."""
    volumes = {v["name"]: v for v in pod_spec(workload).get("volumes", [])}
    for c in pod_spec(workload)["containers"]:
        for mount in c.get("volumeMounts", []):
            source = volumes[mount["name"]].get("secret")
            if source is None or source["secretName"] != secret["metadata"]["name"]:
                continue
            items = source.get("items") or [{"key": k, "path": k} for k in secret["stringData"]]
            for item in items:
                assert item["key"] in secret["stringData"], item
                yield f"{mount['mountPath']}/{item['path']}"


# --------------------------------------------------------------------------- render, validate


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_render_validates_strictly(rendered: str, docs: list[dict[str, Any]], version: str) -> None:
    done = validate(rendered, version)
    assert done.returncode == 0, done.stdout + done.stderr
    for d in docs:
        assert f"{d['kind'].lower()}/{d['metadata']['name']} against" in done.stdout


def test_the_validator_refuses_an_unknown_field(rendered: str) -> None:
    """The strict check can fail: one misspelt field in the render is caught."""
    broken = rendered.replace("readinessProbe:", "readinessProbes:", 1)
    assert broken != rendered
    done = validate(broken, KUBERNETES_VERSIONS[-1])
    assert done.returncode != 0
    assert "readinessProbes" in done.stdout + done.stderr


def test_every_resource_is_in_the_namespace(docs: list[dict[str, Any]]) -> None:
    find(docs, "Namespace", NAMESPACE)
    for d in docs:
        if d["kind"] != "Namespace":
            assert d["metadata"].get("namespace") == NAMESPACE, d["metadata"]


def test_the_images_are_the_one_compose_builds(docs: list[dict[str, Any]]) -> None:
    compose = yaml.safe_load(COMPOSE_FILE.read_text())
    image = compose["x-hubspoke"]["image"]
    workloads = [d for d in docs if d["kind"] in ("Deployment", "DaemonSet", "Job")]
    assert len(workloads) == 3
    for w in workloads:
        spec = pod_spec(w)
        for c in spec.get("initContainers", []) + spec["containers"]:
            assert c["image"] == image, (w["metadata"]["name"], c["name"])


# --------------------------------------------------------------------------- the command lines


def test_the_hubs_command_parses(docs: list[dict[str, Any]]) -> None:
    hub = find(docs, "Deployment", "hubspoke-hub")
    argv = module_argv(expanded_argv(container(hub, "hub")), "hub")
    args = parsed(hub_parse_args, argv)
    assert args.command == "serve"
    port = int(flag(argv, "--port"))
    service = find(docs, "Service", "hubspoke-hub")
    assert [p["port"] for p in service["spec"]["ports"]] == [port]


def test_the_spokes_command_parses(docs: list[dict[str, Any]]) -> None:
    spoke = find(docs, "DaemonSet", "hubspoke-spoke")
    argv = module_argv(expanded_argv(container(spoke, "spoke")), "spoke")
    args = parsed(spoke_parse_args, argv)
    assert args.command == "serve"
    config = spoke_config_from_args(args)
    assert config.advertise == f"http://{FIELD_VALUES['status.podIP']}:{config.port}"
    assert [s.dns for s in config.peers] == [True]


def test_the_warm_jobs_command_parses(docs: list[dict[str, Any]]) -> None:
    job = find(docs, "Job", "hubspoke-warm")
    argv = module_argv(expanded_argv(container(job, "warm")), "spoke")
    args = parsed(spoke_parse_args, argv)
    assert args.command == "warm"
    assert args.prefix is not None or args.paths


def test_the_flags_the_parse_test_relies_on_are_real() -> None:
    """The parse tests can fail: a misspelt flag or a bad peers URL is an argparse error."""
    with pytest.raises(SystemExit), contextlib.redirect_stderr(io.StringIO()):
        spoke_parse_args(["serve", "--hub", "http://h:1", "--cache-dir", "/c", "--capacity",
                          "1GiB", "--peer", "dns+http://x:1"], {})
    with pytest.raises(SystemExit), contextlib.redirect_stderr(io.StringIO()):
        spoke_parse_args(["serve", "--hub", "http://h:1", "--cache-dir", "/c", "--capacity",
                          "1GiB", "--hub-token-file", "/t", "--peers", "dns+http://x"], {})


# --------------------------------------------------------------------------- the wiring


def test_the_peers_name_the_headless_service(docs: list[dict[str, Any]]) -> None:
    spoke = find(docs, "DaemonSet", "hubspoke-spoke")
    argv = expanded_argv(container(spoke, "spoke"))
    match = re.fullmatch(r"dns\+http://([a-z0-9.-]+):(\d+)", flag(argv, "--peers"))
    assert match, flag(argv, "--peers")
    name, port = match[1], int(match[2])
    service = find(docs, "Service", name.split(".")[0])
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"].get("publishNotReadyAddresses", False) is False
    labels = spoke["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    assert [p["port"] for p in service["spec"]["ports"]] == [port]
    assert [p["targetPort"] for p in service["spec"]["ports"]] == [int(flag(argv, "--port"))]
    # The spoke's identity is the address the Service's DNS answers: its pod IP (the node's,
    # on the host network), on the port it listens on.
    assert pod_spec(spoke)["hostNetwork"] is True
    assert pod_spec(spoke)["dnsPolicy"] == "ClusterFirstWithHostNet"
    assert flag(container(spoke, "spoke")["command"], "--advertise") == f"http://$(POD_IP):{port}"


def test_the_spoke_caches_on_the_nodes_disk(docs: list[dict[str, Any]]) -> None:
    spoke = find(docs, "DaemonSet", "hubspoke-spoke")
    spec = pod_spec(spoke)
    assert spec["nodeSelector"], "a spoke goes only to nodes with the cache disk"
    c = container(spoke, "spoke")
    cache_dir = flag(expanded_argv(c), "--cache-dir")
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    volume = next(v for v in spec["volumes"] if v["name"] == mounts[cache_dir])
    assert volume["hostPath"]["path"].startswith("/mnt/nvme/")
    owner = next(i for i in spec["initContainers"] if i["name"] == "cache-owner")
    assert owner["volumeMounts"][0]["mountPath"] == cache_dir
    assert f"{spec['securityContext']['runAsUser']}:" in " ".join(owner["command"])


@pytest.mark.parametrize(
    ("kind", "name", "cname"),
    [("Deployment", "hubspoke-hub", "hub"), ("DaemonSet", "hubspoke-spoke", "spoke")],
)
def test_probes_resources_and_scrape_annotations(
    docs: list[dict[str, Any]], kind: str, name: str, cname: str
) -> None:
    workload = find(docs, kind, name)
    c = container(workload, cname)
    port = int(flag(expanded_argv(c), "--port"))
    named = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert port in named.values()
    for probe in ("readinessProbe", "livenessProbe"):
        get = c[probe]["httpGet"]
        assert get["path"] == "/healthz"
        assert named.get(get["port"], get["port"]) == port
    assert {"cpu", "memory"} <= c["resources"]["requests"].keys()
    annotations = workload["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == str(port)
    assert annotations["prometheus.io/path"] == "/metrics"


def test_every_credential_file_comes_from_the_secret(docs: list[dict[str, Any]]) -> None:
    secret = find(docs, "Secret", "hubspoke-tokens")
    values = secret["stringData"]
    assert values and all(v.startswith("REPLACE-ME") for v in values.values()), (
        "the Secret ships placeholders only, each marked REPLACE-ME"
    )
    file_flags = ("--auth-secret-file", "--hub-token-file", "--peer-secret-file", "--token-file")
    workloads = [d for d in docs if d["kind"] in ("Deployment", "DaemonSet", "Job")]
    used = 0
    for w in workloads:
        provided = set(secret_paths(w, secret))
        for c in pod_spec(w)["containers"]:
            argv = expanded_argv(c)
            for name in file_flags:
                if name in argv:
                    assert flag(argv, name) in provided, (w["metadata"]["name"], name)
                    used += 1
    assert used == 5  # hub: auth; spoke: auth, hub token, peer secret; warm: token


def test_the_warm_job_reaches_a_spoke(docs: list[dict[str, Any]]) -> None:
    job = find(docs, "Job", "hubspoke-warm")
    argv = expanded_argv(container(job, "warm"))
    match = re.fullmatch(r"http://([a-z0-9-]+):(\d+)", flag(argv, "--spoke"))
    assert match
    service = find(docs, "Service", match[1])
    assert int(match[2]) in [p["port"] for p in service["spec"]["ports"]]
    # Not the node-local Service: the Job's node may have no spoke.
    assert service["spec"].get("internalTrafficPolicy") != "Local"
    assert pod_spec(job)["restartPolicy"] in ("OnFailure", "Never")
