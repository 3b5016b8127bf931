"""Fixtures for the integration tests beyond the shared ones in ``tests/conftest.py``."""

from __future__ import annotations

import pytest

from tests.conftest import SpokeFactory
from tests.support.servers import RunningServer


@pytest.fixture(params=["hub", "spoke"])
async def server(
    request: pytest.FixtureRequest, hub: RunningServer, make_spoke: SpokeFactory
) -> RunningServer:
    """The hub, or a spoke in front of it: every test using it runs against both."""
    if request.param == "hub":
        return hub
    return await make_spoke()
