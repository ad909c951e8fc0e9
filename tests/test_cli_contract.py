"""The command line's contract (issue 58, kcache.cli.contract): on a root that does not exist,
every command that reads one exits 1 with one line on stderr naming the path and the fix, and creates
nothing; usage errors exit 2; every failure under --json is one JSON shape on stdout; `kcache help`
documents the statuses. Each case is a fresh interpreter, as a user runs it."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kcache.cli.contract import EXIT_NOT_FOUND, EXIT_USER_ERROR
from kcache.cli.main import ROOT_READERS, build_parser

from .helpers import PROJECT, child_env

# One invocation of each command that reads a root (its required arguments filled in).
READERS = {"stats": [], "ls": [], "show": ["abcd"], "verify": [], "prune": [], "clear": [],
           "export": ["{tmp}/out.kcb"], "verify-coverage": ["--keys", "{tmp}/keys.jsonl"], "why-miss": ["abcd"],
           "tunes": [], "untune": ["abcd"], "gc": [], "doctor": []}
# The commands that read no root, or create theirs (`import` publishes into a new root, `run`'s
# program compiles into one), each for its reason: every command is in one list or the other.
NOT_READERS = {"import", "run", "server", "help", "config"}  # config shows the settings, the root among them
JSON_ERROR_FIELDS = {"error", "path", "exit_status"}


def kcache(*argv: str, cwd: Path = PROJECT, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kcache", *argv], capture_output=True, text=True,
                          env=child_env(**env), cwd=str(cwd), timeout=120, check=False)


def stderr_lines(done: subprocess.CompletedProcess[str]) -> list[str]:
    return [line for line in done.stderr.splitlines() if line.strip()]


def commands_of_the_parser() -> set[str]:
    parser = build_parser()
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return set(subparsers.choices)


def test_every_command_is_known_to_read_a_root_or_not() -> None:
    """A new command must be put on one side: the loop below then covers it."""
    assert set(READERS) == set(ROOT_READERS)
    assert set(READERS) | NOT_READERS == commands_of_the_parser() and not set(READERS) & NOT_READERS


@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
@pytest.mark.parametrize("command", sorted(READERS))
def test_a_missing_root_is_one_line_status_1_and_nothing_is_created(tmp_path: Path, command: str,
                                                                    as_json: bool) -> None:
    (tmp_path / "keys.jsonl").write_text(json.dumps({"key": "ab" * 32, "kernel": "k"}) + "\n")
    before = sorted(os.listdir(tmp_path))
    root = tmp_path / "typo"
    argv = [word.format(tmp=tmp_path) for word in READERS[command]]
    done = kcache("--dir", str(root), *(["--json"] if as_json else []), command, *argv)
    assert done.returncode == EXIT_NOT_FOUND, done.stdout + done.stderr
    (line,) = stderr_lines(done)
    assert line.startswith(f"kcache: no kcache root at {root}: ") and "--dir" in line and "KCACHE_DIR" in line, line
    assert "Traceback" not in done.stderr
    if as_json:
        assert json.loads(done.stdout) == {"error": line.removeprefix("kcache: "), "path": str(root),
                                           "exit_status": EXIT_NOT_FOUND}
    else:
        assert done.stdout == ""
    assert sorted(os.listdir(tmp_path)) == before  # no root, no bundle, nothing


def test_the_default_root_missing_is_named_the_same_way(tmp_path: Path) -> None:
    """No --dir: KCACHE_DIR's root, missing, is named with the same fix."""
    root = tmp_path / "unset-yet"
    done = kcache("stats", KCACHE_DIR=str(root))
    assert done.returncode == EXIT_NOT_FOUND and stderr_lines(done) == [
        f"kcache: no kcache root at {root}: check --dir and KCACHE_DIR (kcache creates a root at its first compile; "
        "`kcache doctor --fix` creates it now)"]
    assert not root.exists()


def test_doctor_fix_creates_the_missing_root_it_names(tmp_path: Path) -> None:
    root = tmp_path / "new"
    done = kcache("--dir", str(root), "--json", "doctor", "--fix")
    assert root.is_dir(), done.stderr
    assert {f["check"]: f for f in json.loads(done.stdout)}["root"]["fixed"]


# Failures of every kind, each with the status and the path its JSON names.
FAILURES = {
    "unknown command": (["bogus"], EXIT_USER_ERROR, None),
    "missing argument": (["show"], EXIT_USER_ERROR, None),
    "bad argument": (["prune", "--max-size", "5Q"], EXIT_USER_ERROR, None),
    "bad setting": (["stats"], EXIT_USER_ERROR, None),
    "root is a file": (["ls"], EXIT_USER_ERROR, "{tmp}/afile"),
    "no entry matches": (["show", "abcd"], EXIT_NOT_FOUND, "{root}"),  # TileLang's and Triton's folders both
    "no result matches": (["untune", "abcd"], EXIT_NOT_FOUND, "{root}/autotuner"),
    "no miss matches": (["why-miss", "abcd"], EXIT_NOT_FOUND, "{root}"),
    "not a key prefix": (["why-miss", "zz"], EXIT_USER_ERROR, None),
    "missing bundle": (["import", "{tmp}/none.kcb"], EXIT_USER_ERROR, None),
    "missing root": (["tunes"], EXIT_NOT_FOUND, "{tmp}/typo"),
}


@pytest.mark.parametrize("case", sorted(FAILURES))
def test_every_failure_under_json_has_one_shape(tmp_path: Path, case: str) -> None:
    argv, status, path = FAILURES[case]
    root = tmp_path / "root"
    root.mkdir()
    (tmp_path / "afile").write_text("not a root")
    where = {"root": root, "tmp": tmp_path}
    chosen = {"root is a file": tmp_path / "afile", "missing root": tmp_path / "typo"}.get(case, root)
    env = {"KCACHE_MAX_SIZE": "banana"} if case == "bad setting" else {}
    done = kcache("--dir", str(chosen), "--json", *[word.format(**where) for word in argv], **env)
    assert done.returncode == status, done.stdout + done.stderr
    (line,) = stderr_lines(done)
    answer = json.loads(done.stdout)
    assert set(answer) == JSON_ERROR_FIELDS and answer["exit_status"] == status
    assert answer["error"] == line.removeprefix("kcache: ") and "Traceback" not in done.stderr
    if path is not None:
        assert answer["path"] == path.format(**where)


@pytest.mark.parametrize("argv", [["bogus"], ["show"], ["prune", "--max-size", "5Q"], ["server", "restart"],
                                  ["help", "nosuchcommand"]], ids=" ".join)
def test_usage_errors_exit_2_with_one_line(tmp_path: Path, argv: list[str]) -> None:
    done = kcache("--dir", str(tmp_path), *argv)
    assert done.returncode == EXIT_USER_ERROR and done.stdout == ""
    assert len(stderr_lines(done)) == 1 and "Traceback" not in done.stderr


def test_show_and_untune_say_no_match_on_stderr(tmp_path: Path) -> None:
    for command in ("show", "untune"):
        done = kcache("--dir", str(tmp_path), command, "abcd")
        assert done.returncode == EXIT_NOT_FOUND and done.stdout == "", done.stdout
        (line,) = stderr_lines(done)
        assert f"{command}: no " in line and "'abcd'" in line and f"kcache {'ls' if command == 'show' else 'tunes'}" in line


def test_help_documents_the_exit_statuses() -> None:
    done = kcache("help")
    assert done.returncode == 0
    text = done.stdout[done.stdout.index("exit status:"):]
    for status in ("0 ", "1 ", "2 ", "130, 143", "141"):
        assert f"\n  {status}" in text, text
    assert '{"error": LINE, "path": PATH or null, "exit_status": N}' in text
