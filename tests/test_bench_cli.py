"""`python -m stress.bench`'s own command line, on the CPU: what --profile hands the profile, and a
scenario with no profile refused in one line."""

from __future__ import annotations

import pytest

from stress.bench.__main__ import main, profile_arguments


def test_a_profile_gets_every_argument_but_only_and_profile() -> None:
    # --repeats and --json are also the bench's own options: the profile must still see them.
    argv = ["--only", "disk", "--profile", "--repeats", "2", "--json", "out.json", "--only=cold", "--kernel", "add"]
    assert profile_arguments(argv) == ["--repeats", "2", "--json", "out.json", "--kernel", "add"]


def test_a_scenario_without_a_profile_is_refused_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--only", "memory", "--profile"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["stress.bench: --profile needs --only with one of herd, disk, cold, triton, helion"]
