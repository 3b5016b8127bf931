"""Each setting is one declaration (service.settings): its flag, its HUBSPOKE_ variable, its
help and its default all come from it, for the hub and the spoke alike."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from pathlib import Path
from typing import Any

import aiohttp
import msgpack
import pytest

from hub.config import HubConfig
from hub.config import build_parser as hub_parser
from hub.config import parse_config as hub_config
from service.settings import METADATA_KEY, REQUIRED, Setting, declared
from spoke.config import SpokeConfig, config_from_args, parse_args
from spoke.config import build_parser as spoke_parser
from tests.support.servers import start_process

SPOKE = ["serve", "--hub", "http://hub:8700", "--cache-dir", "/var/cache/spoke", "--capacity",
         "1GiB"]
HUB = ["serve", "--root", "/data"]


def spoke_config(env: dict[str, str], *flags: str) -> SpokeConfig:
    return config_from_args(parse_args([*SPOKE, *flags], env))


def hub_settings(env: dict[str, str], *flags: str) -> HubConfig:
    return hub_config([*HUB, *flags], env)[1]


def serve_help(parser: Any) -> str:
    serve = parser._subparsers._group_actions[0].choices["serve"]
    return str(serve.format_help())


@pytest.mark.parametrize("cls, parser, given", [
    (SpokeConfig, spoke_parser, SPOKE), (HubConfig, hub_parser, HUB),
])
def test_every_setting_has_a_flag_a_variable_a_help_line_and_its_default(
    cls: Any, parser: Any, given: list[str]
) -> None:
    specs = declared(cls)
    assert len(specs) == len(dataclasses.fields(cls))
    # argparse wraps long lines; a flag's help, its variable and its default read as one line
    text = " ".join(serve_help(parser({})).split())
    config = config_from_args(parse_args(given, {})) if cls is SpokeConfig \
        else hub_config(given, {})[1]
    for f in dataclasses.fields(cls):
        spec = f.metadata[METADATA_KEY]
        assert isinstance(spec, Setting) and spec.flag.startswith("--")
        if spec.internal:
            assert spec.env is None and spec.flag not in text
            continue
        assert spec.env == "HUBSPOKE_" + spec.flag[2:].replace("-", "_").upper()
        assert spec.help and f"{' '.join(spec.help.split())} [env {spec.env}]" in text
        if spec.default is REQUIRED:
            assert spec.flag in given
        else:
            assert getattr(config, f.name) == f.default == spec.value(), spec.flag
            if spec.default is not None:
                assert f"[env {spec.env}] (default: {spec.default})" in text


def test_help_lists_the_flags_in_the_order_the_config_reads() -> None:
    def flags(parser: Any) -> list[str]:
        usage = serve_help(parser({})).split("\n\n")[0]
        return [word.strip("[]") for word in usage.split() if word.startswith(("--", "[--"))]

    spoke = flags(spoke_parser)
    assert spoke[:6] == ["--hub", "--cache-dir", "--capacity", "--policy", "--host", "--port"]
    assert spoke[-2:] == ["--workers", "--cpu-affinity"]
    assert spoke.index("--access-log") < spoke.index("--hub-token-file") < spoke.index("--tls-cert")
    assert flags(hub_parser) == [
        "--root", "--host", "--port", "--chunk-size", "--digest-alg", "--workers", "--log-level",
        "--log-format", "--access-log", "--auth-secret-file", "--auth-previous-secret-file",
        "--metrics-auth", "--tls-cert", "--tls-key", "--max-inflight-per-client",
        "--max-connections-per-client", "--header-timeout", "--keepalive-timeout",
        "--s3-endpoint", "--s3-timeout", "--index-dir"]


def test_the_shared_settings_are_the_same_declarations_on_hub_and_spoke() -> None:
    hub = {spec.flag: spec for spec in declared(HubConfig)}
    spoke = {spec.flag: spec for spec in declared(SpokeConfig)}
    shared = hub.keys() & spoke.keys()
    assert {"--log-level", "--auth-secret-file", "--tls-cert", "--keepalive-timeout"} <= shared
    # Each its own port, and its own processes (the spoke's are an owner and readers,
    # the hub's peers).
    for flag in shared - {"--port", "--workers"}:
        assert hub[flag] is spoke[flag], flag


@pytest.mark.parametrize("variable, text, field, value", [
    ("HUBSPOKE_PORT", "9001", "port", 9001),  # int
    ("HUBSPOKE_FETCH_CONCURRENCY", "3", "fetch_concurrency", 3),  # positive int
    ("HUBSPOKE_READAHEAD", "-2", "readahead_chunks", 0),  # a count: negative is none
    ("HUBSPOKE_PLAN_WINDOW", "1GiB", "plan_window_bytes", 1 << 30),  # size
    ("HUBSPOKE_SCRUB_RATE", "0", "scrub_rate_bytes_s", 0),
    ("HUBSPOKE_VERIFY_ON_START", "yes", "verify_on_start", True),  # switch
    ("HUBSPOKE_VERIFY_ON_START", "0", "verify_on_start", False),
    ("HUBSPOKE_POLICY", "lru", "policy", "lru"),  # choice
    ("HUBSPOKE_LOG_FORMAT", "json", "log_format", "json"),
    ("HUBSPOKE_META_TTL", "0.25", "meta_ttl_s", 0.25),  # float
    ("HUBSPOKE_KEEPALIVE_TIMEOUT", "5", "keepalive_timeout_s", 5.0),
    ("HUBSPOKE_MAX_AGE", "12h", "max_age_s", 43200.0),
    ("HUBSPOKE_PIN", "a/, b/c", "pinned_prefixes", ("a/", "b/c")),
    ("HUBSPOKE_HUB_CA", "/etc/ca.pem", "hub_ca", "/etc/ca.pem"),  # path
    ("HUBSPOKE_HUB_TOKEN_FILE", "", "hub_token_file", None),  # empty: unset
    ("HUBSPOKE_AUTH_SECRET_FILE", "/run/secret", "auth_secret_file", "/run/secret"),
])
def test_the_spoke_reads_each_kind_of_setting_from_its_variable(
    variable: str, text: str, field: str, value: object
) -> None:
    config = spoke_config({variable: text})
    assert getattr(config, field) == value
    assert type(getattr(config, field)) is type(value)


def test_the_hub_reads_its_variables_and_a_flag_wins_over_one() -> None:
    env = {"HUBSPOKE_ROOT": "/srv", "HUBSPOKE_CHUNK_SIZE": "64KiB", "HUBSPOKE_PORT": "1",
           "HUBSPOKE_TLS_CERT": "c.pem", "HUBSPOKE_TLS_KEY": "k.pem",
           "HUBSPOKE_DIGEST_ALG": "sha256", "HUBSPOKE_HEADER_TIMEOUT": "2.5"}
    _, config = hub_config(["serve", "--port", "0"], env)
    assert (config.root, config.chunk_size, config.port) == ("/srv", 64 << 10, 0)
    assert (config.tls_cert, config.tls_key) == ("c.pem", "k.pem")
    assert (config.digest_alg, config.header_timeout_s) == ("sha256", 2.5)
    assert spoke_config({"HUBSPOKE_CAPACITY": "0"}).capacity_bytes == 1 << 30


@pytest.mark.parametrize("who, env, message", [
    ("spoke", {"HUBSPOKE_PORT": "x"}, "argument --port: invalid int value: 'x'"),
    ("spoke", {"HUBSPOKE_READAHEAD": "x"}, "argument --readahead: invalid int value: 'x'"),
    ("spoke", {"HUBSPOKE_META_TTL": "soon"}, "argument --meta-ttl: invalid float value: 'soon'"),
    ("spoke", {"HUBSPOKE_PLAN_WINDOW": "0"}, "argument --plan-window: must be positive, not 0"),
    ("spoke", {"HUBSPOKE_TENANT_QUOTA": "lots"}, "argument --tenant-quota: "),
    ("spoke", {"HUBSPOKE_PIN_FRACTION": "1.5"},
     "argument --pin-fraction: a fraction between 0 and 1, not 1.5"),
    ("spoke", {"HUBSPOKE_MAX_AGE": "forever"},
     "argument --max-age: not a lifetime: 'forever' (try 30s, 15m, 1h or 7d)"),
    ("spoke", {"HUBSPOKE_WORKERS": "0"}, "argument --workers: --workers must be at least 1"),
    ("spoke", {"HUBSPOKE_PIN": "../x"},
     "argument --pin: '../x': '.' and '..' segments are refused"),
    ("spoke", {"HUBSPOKE_TLS_KEY": "k.pem"}, "--tls-cert and --tls-key go together"),
    ("spoke", {"HUBSPOKE_POLICY": "fifo"},
     "argument --policy: invalid choice: 'fifo' (choose from 'arc', 'lru', 's3fifo', 'wtinylfu')"),
    ("spoke", {"HUBSPOKE_WORKERS": "2", "HUBSPOKE_TLS_CERT": "c", "HUBSPOKE_TLS_KEY": "k"},
     "--workers above 1 needs plain HTTP"),
    ("hub", {"HUBSPOKE_CHUNK_SIZE": "0"}, "argument --chunk-size: must be positive, not 0"),
    ("hub", {"HUBSPOKE_KEEPALIVE_TIMEOUT": "0"},
     "argument --keepalive-timeout: must be positive, not 0"),
    ("hub", {"HUBSPOKE_LOG_LEVEL": "loud"}, "argument --log-level: invalid choice: 'loud'"),
    ("hub", {"HUBSPOKE_DIGEST_ALG": "md5"}, "argument --digest-alg: invalid choice: 'md5'"),
])
def test_a_bad_variable_is_refused_like_a_bad_flag(
    who: str, env: dict[str, str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        spoke_config(env) if who == "spoke" else hub_settings(env)
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err


def test_a_bad_choice_as_a_flag_is_argparse_s_own_message(
    capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        spoke_config({}, "--policy", "fifo")
    assert ("argument --policy: invalid choice: 'fifo' (choose from 'arc', 'lru', 's3fifo', "
            "'wtinylfu')") in capsys.readouterr().err


def test_required_settings_come_from_a_flag_or_a_variable(
    capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        parse_args(["serve", "--cache-dir", "/c"], {})
    assert "the following arguments are required: --hub, --capacity" in capsys.readouterr().err
    env = {"HUBSPOKE_HUB": "http://h", "HUBSPOKE_CAPACITY": "2MiB"}
    config = config_from_args(parse_args(["serve", "--cache-dir", "/c"], env))
    assert (config.hub_url, config.capacity_bytes) == ("http://h", 2 << 20)
    assert parse_args(["verify"], {"HUBSPOKE_CACHE_DIR": "/c"}).cache_dir == "/c"


async def test_real_servers_start_from_their_variables(
    dataset: tuple[Path, dict[str, bytes]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root, files = dataset
    monkeypatch.setenv("HUBSPOKE_ROOT", str(root))
    monkeypatch.setenv("HUBSPOKE_CHUNK_SIZE", "64KiB")
    monkeypatch.setenv("HUBSPOKE_DIGEST_ALG", "sha256")
    monkeypatch.setenv("HUBSPOKE_PORT", "1")  # start_process's --port 0 wins
    hub = await asyncio.to_thread(start_process, "hub", [], log_dir=str(tmp_path))
    spoke = None
    try:
        monkeypatch.setenv("HUBSPOKE_HUB", hub.url)
        monkeypatch.setenv("HUBSPOKE_CACHE_DIR", str(tmp_path / "cache"))
        monkeypatch.setenv("HUBSPOKE_CAPACITY", "3MiB")
        monkeypatch.setenv("HUBSPOKE_POLICY", "lru")
        spoke = await asyncio.to_thread(start_process, "spoke", [], log_dir=str(tmp_path))
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{hub.url}/manifest/ds/big.bin") as resp:
                manifest = msgpack.unpackb(await resp.read())
            assert (manifest["chunk_size"], manifest["digest_alg"]) == (64 << 10, "sha256")
            async with http.get(f"{spoke.url}/objects/ds/small.bin") as resp:
                assert await resp.read() == files["ds/small.bin"]
            async with http.get(f"{spoke.url}/stats") as resp:
                stats = json.loads(await resp.text())
            assert (stats["policy"], stats["capacity_bytes"]) == ("lru", 3 << 20)
    finally:
        if spoke is not None:
            spoke.stop()
        hub.stop()
