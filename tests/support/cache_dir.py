"""What a spoke's cache directory holds on disk, read by tests behind the spoke's back."""

from __future__ import annotations

from pathlib import Path


def chunk_files(cache_dir: Path) -> list[Path]:
    """Every chunk file under ``cache_dir/chunks`` (one folder level down), sorted."""
    return sorted(p for p in (cache_dir / "chunks").glob("*/*") if p.is_file())
