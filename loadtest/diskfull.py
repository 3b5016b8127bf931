"""A disk that fills up on cue: the soak's disk-full phase.

The spoke's cache directory sits on a tmpfs of a fixed size (mounting one needs
root; the soak leaves the phase out otherwise). During the phase a filler file
takes every free byte, and takes it again each time the spoke frees some by
evicting, so every write the spoke makes (chunk file, index, manifest, access
times) can meet ``ENOSPC``. Afterwards the filler is removed and the space is back.
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager, suppress

_BLOCK = bytes(1 << 20)  # written, not truncated to: tmpfs must really allocate the pages


def can_mount() -> bool:
    """Whether this process may mount a tmpfs (root, with ``mount`` on PATH)."""
    return os.geteuid() == 0 and shutil.which("mount") is not None


@contextmanager
def small_filesystem(path: str, size_bytes: int) -> Iterator[str]:
    """A tmpfs of ``size_bytes`` mounted on the existing directory ``path``."""
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_bytes},mode=0700",
                    "hubspoke-soak", path], check=True)
    try:
        yield path
    finally:
        # Lazy: a server that still holds a file there must not keep the mount alive.
        subprocess.run(["umount", "-l", path], check=False)


class DiskFiller:
    """Keeps the filesystem holding ``directory`` full while asked to."""

    def __init__(self, directory: str) -> None:
        self.path = os.path.join(directory, "disk-full-filler")

    def top_up(self) -> int:
        """Write to the filler until the filesystem refuses; the bytes it took this time."""
        taken = 0
        with open(self.path, "ab", buffering=0) as f:
            while True:
                try:
                    written = f.write(_BLOCK)
                except OSError as exc:
                    if exc.errno != errno.ENOSPC:
                        raise
                    return taken
                taken += written or 0
                if written != len(_BLOCK):  # a short write: the last free bytes went
                    return taken

    def release(self) -> None:
        with suppress(FileNotFoundError):
            os.unlink(self.path)

    def free_bytes(self) -> int:
        st = os.statvfs(os.path.dirname(self.path))
        return st.f_bavail * st.f_frsize
