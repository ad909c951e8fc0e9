"""A C compiler wrapper for the link's tests: it logs each run's arguments, then does what the test
says, then runs TVM's compiler. `CXX` names it, which TVM's `get_cc` reads at each link."""

from __future__ import annotations

from pathlib import Path

import pytest
from tvm.contrib import cc as tvm_cc

WRAPPER = """#!/bin/sh
echo "$*" >> "{log}"
{before}
exec "{real}" "$@"
"""


def wrap_cc(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, before: str = ":") -> Path:
    """Put the wrapper in force for this test, running the shell code `before` ahead of the compiler
    (it sees the arguments as "$@"); the path of its log."""
    log = tmp_path / "cc.log"
    wrapper = tmp_path / "cc"
    wrapper.write_text(WRAPPER.format(log=log, before=before, real=tvm_cc.get_cc()))
    wrapper.chmod(0o755)
    monkeypatch.setenv("CXX", str(wrapper))
    return log
