"""The SDK's public import paths from before the layout keep naming the same objects."""

from __future__ import annotations

import importlib

import fsspec  # type: ignore[import-untyped]
import pytest

from spoke.client.fsspec_fs import HubspokeFileSystem


@pytest.mark.parametrize(
    ("old", "new", "names"),
    [
        ("spoke.client", "spoke.client.clients", ["AsyncClient", "Client", "ObjectNotFound",
                                                  "VersionChanged", "Unavailable"]),
        ("spoke.torch_dataset", "spoke.client.torch_dataset", ["ShardedSamples"]),
        ("spoke.fsspec_fs", "spoke.client.fsspec_fs", ["HubspokeFileSystem", "HubspokeFile"]),
    ],
)
def test_an_old_import_path_names_the_same_object(old: str, new: str, names: list[str]) -> None:
    before, after = importlib.import_module(old), importlib.import_module(new)
    for name in names:
        assert getattr(before, name) is getattr(after, name)


def test_fsspec_finds_the_filesystem_by_its_protocol() -> None:
    assert fsspec.get_filesystem_class("hubspoke") is HubspokeFileSystem
