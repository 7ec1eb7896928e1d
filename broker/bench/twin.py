"""Benchmark: placeholder, to be filled in by its owner."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    """Mount this benchmark on `skyfed bench`."""
