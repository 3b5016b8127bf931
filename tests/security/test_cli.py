"""``python -m hub token`` and the security flags of both servers, as real processes."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest
import trustme

from hub.__main__ import main as hub_main
from loadtest import procs
from protocol.auth import verify
from service.auth import load_secret, load_token
from service.tls import client_context
from tests.security.conftest import Dataset, call, problem
from tests.security.test_tls import issue
from tests.support.servers import Process, start_process


def hub_token(*args: str) -> subprocess.CompletedProcess[str]:
    """``python -m hub token ARGS`` as a child process (about a second of imports)."""
    return subprocess.run([sys.executable, "-m", "hub", "token", *args], cwd=procs.REPO,
                          capture_output=True, text=True, timeout=30, check=False)


def hub_token_here(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """The same command through ``hub.__main__.main`` in this process: (code, out, err)."""
    capsys.readouterr()
    try:
        code = hub_main(["token", *args])
    except SystemExit as exc:  # argparse's usage errors
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def processes() -> Iterator[list[Process]]:
    running: list[Process] = []
    yield running
    for process in reversed(running):
        process.stop()


@pytest.fixture
def https_listening(monkeypatch: pytest.MonkeyPatch) -> None:
    """Let start_process recognise ``listening on https://...`` too."""


def test_token_cli_prints_the_token_alone(secret_file: Path) -> None:
    started = time.time()
    result = hub_token("--secret-file", str(secret_file), "--tenant", "team-a",
                       "--prefix", "ds/", "--prefix", "eval", "--admin", "--ttl", "2h")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 1 and lines[0] == result.stdout.strip()
    token = lines[0]
    assert token not in result.stderr and "team-a" in result.stderr
    claims = verify(token, [secret_file.read_bytes().strip()], time.time())
    assert claims.tenant == "team-a" and claims.prefixes == ("ds/", "eval") and claims.admin
    assert started + 7200 - 2 <= claims.expires_at <= time.time() + 7200


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--ttl", "1w"], "lifetime"),
        (["--ttl", "0s"], "lifetime"),
        (["--prefix", "../etc"], "cannot mint"),
        (["--tenant", "bad tenant"], "cannot mint"),
    ],
)
def test_token_cli_refuses_bad_arguments(
    secret_file: Path, args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    base = {"--tenant": "t", "--prefix": "ds/", "--ttl": "1h"}
    for flag, value in zip(args[::2], args[1::2], strict=True):
        base[flag] = value
    code, out, err = hub_token_here(capsys, "--secret-file", str(secret_file),
                                    *[part for pair in base.items() for part in pair])
    assert code == 2 and out == "" and message in err


def test_token_cli_refuses_missing_or_short_secrets(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    short = tmp_path / "short"
    short.write_text("tooshort")
    for path, message in ((tmp_path / "missing", "cannot read"), (short, "at least 16 bytes")):
        code, out, err = hub_token_here(capsys, "--secret-file", str(path), "--tenant", "t",
                                        "--prefix", "")
        assert code == 2 and out == "" and message in err


async def test_minted_token_against_real_hub_and_spoke_over_tls(
    dataset: Dataset, secret_file: Path, tmp_path: Path, processes: list[Process],
    https_listening: None, capsys: pytest.CaptureFixture[str],
) -> None:
    """The whole chain as an operator runs it: minted tokens, TLS and auth on both servers."""
    ca = trustme.CA()
    hub_pki = issue(ca, tmp_path / "hub-pki", "127.0.0.1")
    spoke_pki = issue(ca, tmp_path / "spoke-pki", "127.0.0.1")

    def mint(tenant: str, prefix: str, *extra: str) -> str:
        code, out, err = hub_token_here(capsys, "--secret-file", str(secret_file),
                                        "--tenant", tenant, "--prefix", prefix, *extra)
        assert code == 0, err
        return out.strip()

    spoke_token = tmp_path / "spoke.token"
    spoke_token.write_text(mint("spoke-1", "", "--ttl", "1d") + "\n")
    from_process = hub_token("--secret-file", str(secret_file), "--tenant", "a", "--prefix", "ds/")
    assert from_process.returncode == 0, from_process.stderr
    tenant_a, tenant_b = from_process.stdout.strip(), mint("b", "other/")
    auth = ["--auth-secret-file", str(secret_file)]
    hub = start_process("hub", ["--root", str(dataset[0]), "--chunk-size", "64KiB", *auth,
                                "--tls-cert", str(hub_pki.cert_file),
                                "--tls-key", str(hub_pki.key_file)])
    processes.append(hub)
    spoke = start_process("spoke", [
        "--hub", hub.url, "--cache-dir", str(tmp_path / "cache"), "--capacity", "64MiB", *auth,
        "--hub-token-file", str(spoke_token), "--hub-ca", str(hub_pki.ca_file),
        "--tls-cert", str(spoke_pki.cert_file), "--tls-key", str(spoke_pki.key_file),
    ])
    processes.append(spoke)
    assert hub.url.startswith("https://") and spoke.url.startswith("https://")
    connector = aiohttp.TCPConnector(ssl=client_context(str(hub_pki.ca_file)))
    async with aiohttp.ClientSession(connector=connector) as https:
        for url in (hub.url, spoke.url):
            problem(await call(https, f"{url}/objects/ds/small.bin"), 401)
            status, _, body = await call(https, f"{url}/objects/ds/small.bin", tenant_a)
            assert status == 200 and body == dataset[1]["ds/small.bin"]
            problem(await call(https, f"{url}/objects/ds/small.bin", tenant_b), 403)
            assert (await call(https, f"{url}/healthz"))[0] == 200
    for process in (hub, spoke):
        for _ in range(600):  # the access log writes its lines in batches, soon after
            log = "\n".join(process.log)
            if "/objects/ds/small.bin" in log:
                break
            await asyncio.sleep(0.05)
        assert "/objects/ds/small.bin" in log  # the access log is on...
        for token in (tenant_a, tenant_b, spoke_token.read_text().strip()):
            assert token.rsplit(".", 1)[1] not in log  # ...and never shows a token


def test_tls_flags_go_together(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        hub_main(["serve", "--root", str(tmp_path), "--tls-cert", "x.pem"])
    assert exited.value.code == 2 and "--tls-key" in capsys.readouterr().err


def test_secret_and_token_files(
    tmp_path: Path, secret_file: Path, caplog: pytest.LogCaptureFixture
) -> None:
    assert load_secret(str(secret_file)) == secret_file.read_bytes().strip()
    assert "readable by other users" not in caplog.text
    secret_file.chmod(0o644)
    load_secret(str(secret_file))
    assert "readable by other users" in caplog.text
    empty = tmp_path / "empty.token"
    empty.write_text("\n")
    with pytest.raises(ValueError, match="empty"):
        load_token(str(empty))
