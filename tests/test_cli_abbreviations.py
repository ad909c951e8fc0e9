"""No option matches by a prefix of its name (issue 68): argparse's default took `kcache stats --zer` for
`--zero` and zeroed the counters, and `kcache clear --all` for `--all-versions`. Each is refused in one
line with exit status 2, naming the whole option, and nothing is changed; every option of every command
is checked the same way, as is the stress harness's command line."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

from kcache.cli.contract import UserMistake
from kcache.cli.parser import build_parser

from .helpers import PROJECT, child_env

ONE_KERNEL = """
import kcache
from stress.programs import synthetic
kcache.KernelCache({root!r}, backend=synthetic).get_or_compile(synthetic.SyntheticFunc("k0"), "synthetic")
"""


def kcache(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kcache", *argv], capture_output=True, text=True, env=child_env(),
                          cwd=str(PROJECT), timeout=120, check=False)


@pytest.fixture
def root_with_an_entry(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    subprocess.run([sys.executable, "-c", ONE_KERNEL.format(root=str(root))], env=child_env(), cwd=str(PROJECT),
                   timeout=120, check=True)
    return root


def stats(root: Path) -> dict:
    done = kcache("--dir", str(root), "--json", "stats")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.mark.parametrize(("argv", "whole"), [(["stats", "--zer"], "--zero"), (["clear", "--all"], "--all-versions")])
def test_a_destructive_option_must_be_spelled_whole(root_with_an_entry: Path, argv: list[str], whole: str) -> None:
    before = stats(root_with_an_entry)
    assert before["compiles"] == 1 and before["entries"] == 1, before  # something to zero, something to clear
    done = kcache("--dir", str(root_with_an_entry), *argv)
    assert done.returncode == 2 and done.stdout == "", done.stdout
    (line,) = done.stderr.splitlines()
    assert f"unrecognized arguments: {argv[1]}" in line and f"did you mean {whole}?" in line, line
    after = stats(root_with_an_entry)
    assert (after["compiles"], after["entries"]) == (1, 1), after  # not zeroed, not cleared


def parsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """The main parser and every command's."""
    found = {"kcache": parser}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            found.update({f"kcache {name}": sub for name, sub in action.choices.items()})
    return found


# What each command needs besides its options, to parse (the main parser's options go before `ls`).
REQUIRED = {"kcache": ["ls"], "kcache show": ["KEY"], "kcache untune": ["KEY"], "kcache export": ["B"],
            "kcache import": ["B"], "kcache verify-coverage": ["--keys", "F"], "kcache server": ["status"],
            "kcache run": ["program.py"], "kcache why-miss": ["KEY"]}


def test_no_option_of_any_command_matches_by_prefix() -> None:
    every = parsers(build_parser())
    assert len(every) > 15 and all(parser.allow_abbrev is False for parser in every.values())
    tried = []
    for name, parser in every.items():
        command = name.split()[1:]
        base = [*command, *REQUIRED.get(name, [])]
        build_parser().parse_args(base)  # parses as it is: what follows adds only the prefix
        for action in parser._actions:
            for option in action.option_strings:
                if not option.startswith("--") or len(option) < 5 or option == "--help":
                    continue
                # Before `run`'s script: after it, every word is the program's.
                argv = [option[:-1], *base] if name == "kcache" else [*command, option[:-1], *base[len(command):]]
                with pytest.raises(UserMistake, match=f"unrecognized arguments: {option[:-1]} "):
                    build_parser().parse_args(argv)
                tried.append(f"{name} {option[:-1]}")
    assert "kcache stats --zer" in tried and "kcache clear --all-version" in tried and len(tried) > 20, tried


def test_the_stress_harness_takes_no_prefix_either() -> None:
    done = subprocess.run([sys.executable, "-m", "stress", "--dur", "1"], capture_output=True, text=True,
                          env=child_env(), cwd=str(PROJECT), timeout=120, check=False)
    assert done.returncode == 2 and "unrecognized arguments: --dur" in done.stderr, done.stderr
    done = subprocess.run([sys.executable, "-m", "stress.bench", "--plot"], capture_output=True, text=True,
                          env=child_env(), cwd=str(PROJECT), timeout=120, check=False)
    assert done.returncode != 0 and "--plot" in done.stderr, done.stderr
