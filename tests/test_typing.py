"""Typing as users consume it: both packages ship py.typed, and the public API modules pass
`mypy --strict` (the file list and the settings are in pyproject.toml's [tool.mypy])."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

PROJECT = Path(__file__).resolve().parent.parent


def test_both_packages_ship_py_typed() -> None:
    for package in ("kcache", "autotuner"):
        assert (PROJECT / package / "py.typed").is_file(), f"{package}/py.typed is missing"


def test_the_public_api_passes_mypy_strict(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "mypy", "--cache-dir", str(tmp_path / "mypy-cache")],
                            cwd=PROJECT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Success: no issues found" in result.stdout
