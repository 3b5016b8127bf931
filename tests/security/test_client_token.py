"""The loader client's bearer token, against a spoke that checks tokens."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from spoke.client.clients import Client, HubspokeError
from tests.security.conftest import AuthSpokeFactory, Mint


async def test_the_sync_client_sends_its_token(
    make_auth_spoke: AuthSpokeFactory, mint: Mint, dataset: tuple[Path, dict[str, bytes]]
) -> None:
    _, files = dataset
    spoke = await make_auth_spoke()
    with Client(spoke.url, token=mint("team-a", ["ds/"]), max_retries=0) as client:
        data = await asyncio.to_thread(client.read, "ds/small.bin", 0, 10)
        assert data == files["ds/small.bin"][:10]
        with pytest.raises(HubspokeError) as refused:
            await asyncio.to_thread(client.read, "other/notes.csv", 0, 10)
        assert refused.value.status == 403
    with Client(spoke.url, max_retries=0) as anonymous:
        with pytest.raises(HubspokeError) as missing:
            await asyncio.to_thread(anonymous.read, "ds/small.bin", 0, 10)
        assert missing.value.status == 401


async def test_warm_cli_with_a_token_file(
    make_auth_spoke: AuthSpokeFactory, mint: Mint, tmp_path: Path
) -> None:
    import subprocess
    import sys

    spoke = await make_auth_spoke()
    token = tmp_path / "admin.token"
    token.write_text(mint("ops", [""], admin=True) + "\n")

    def warm(*extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "spoke", "warm", "--spoke", spoke.url,
                               "--prefix", "other/", "--quiet", *extra],
                              capture_output=True, text=True, timeout=60)

    assert (await asyncio.to_thread(warm, "--token-file", str(token))).returncode == 0
    refused = await asyncio.to_thread(warm)
    assert refused.returncode == 2
    assert "token" in refused.stderr.lower()
