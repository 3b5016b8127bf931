"""The import path loaders used before the SDK moved to :mod:`spoke.client`; kept so their
code keeps working. New code imports :mod:`spoke.client.torch_dataset`."""

from spoke.client.torch_dataset import ShardedSamples

__all__ = ["ShardedSamples"]
