"""The import path of the ``hubspoke://`` filesystem before the SDK moved to
:mod:`spoke.client`; kept for code that names the class. New code imports
:mod:`spoke.client.fsspec_fs` (fsspec finds it through the package's entry point)."""

from spoke.client.fsspec_fs import ENDPOINT_ENV, HubspokeFile, HubspokeFileSystem

__all__ = ["ENDPOINT_ENV", "HubspokeFile", "HubspokeFileSystem"]
