"""The `kcache` command line, on a populated root with a corrupt entry and a partial write."""

from __future__ import annotations

import importlib.util
import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kcache.cli.main import build_parser, main
from kcache.maintenance.eviction import scan_entries

from .helpers import PROJECT, child_env
from .test_eviction import POPULATE


def kcache_cli(root: Path, *args: str) -> tuple[int, object]:
    """Run `python -m kcache --dir ROOT --json ARGS` in a fresh interpreter; (exit status, parsed output)."""
    return kcache_json("--dir", str(root), "--json", *args)


def kcache_json(*argv: str) -> tuple[int, object]:
    """Run `python -m kcache ARGV` in a fresh interpreter; (exit status, its output parsed as JSON)."""
    done = subprocess.run([sys.executable, "-m", "kcache", *argv],
                          capture_output=True, text=True, env=child_env(), cwd=str(PROJECT), check=False)
    assert done.stdout, done.stderr
    try:
        return done.returncode, json.loads(done.stdout)
    except ValueError:
        raise AssertionError(f"kcache {' '.join(argv)} printed no JSON:\n{done.stdout}{done.stderr}") from None


@pytest.fixture
def populated(cache_root: Path) -> dict:
    names = [f"k{i}" for i in range(6)]
    subprocess.run([sys.executable, "-c", POPULATE.format(root=str(cache_root), names=names)],
                   env=child_env(), cwd=str(PROJECT), check=True, capture_output=True)
    entries = sorted(scan_entries(cache_root), key=lambda e: e.key)
    corrupt = entries[0]
    library = corrupt.path / "kernel.so"
    data = library.read_bytes()
    library.write_bytes(data[:100])  # truncated
    partial = cache_root / ".staging" / f"{'ab' * 16}.{os.uname().nodename}.999999999.deadbeef"
    partial.mkdir(parents=True)
    (partial / "kernel.so").write_bytes(b"half")
    return {"keys": [e.key for e in entries], "corrupt": corrupt.key, "size": entries[1].size}


def test_stats_ls_show(cache_root: Path, populated: dict) -> None:
    status, stats = kcache_cli(cache_root, "stats")
    assert status == 0 and stats["entries"] == 6 and stats["compiles"] == 6 and stats["misses"] == 6
    status, listing = kcache_cli(cache_root, "ls")
    assert status == 0 and sorted(e["key"] for e in listing) == populated["keys"]
    assert {e["kernel"] for e in listing} == {f"k{i}" for i in range(6)}
    key = populated["keys"][1]
    status, shown = kcache_cli(cache_root, "show", key[:10])
    assert status == 0 and shown["key"] == key and shown["meta"]["kernel"] in {e["kernel"] for e in listing}
    assert set(shown["manifest"]["files"]) >= {"kernel.so", "host.cu"}
    assert all(Path(p).is_file() for p in shown["sources"].values())
    status, missing = kcache_cli(cache_root, "show", "ffffffff")
    assert status == 1 and "no entry" in missing["error"]


def test_verify_reports_then_repairs_the_corrupt_entry(cache_root: Path, populated: dict) -> None:
    status, report = kcache_cli(cache_root, "verify")
    assert status == 1 and [b["key"] for b in report["bad"]] == [populated["corrupt"]]
    assert report["staging_in_progress"] == 1  # the partial write: never visible as an entry
    status, report = kcache_cli(cache_root, "verify", "--repair")
    assert status == 0 and report["bad"][0]["quarantined"]
    status, report = kcache_cli(cache_root, "verify")
    assert status == 0 and (report["entries"], report["bad"]) == (5, [])


def test_gc_prune_and_clear(cache_root: Path, populated: dict) -> None:
    status, report = kcache_cli(cache_root, "gc")
    assert status == 0 and report["staging_removed"] == 1 and report["stats_folded"] == 1
    now = time.time()
    for rank, key in enumerate(populated["keys"]):
        os.utime(cache_root / "kernels" / key, (now - 10 * rank, now - 10 * rank))  # the first key is the newest
    status, report = kcache_cli(cache_root, "prune", "--max-size", str(2 * populated["size"] + 10))
    assert status == 0 and (report["evicted"], report["remaining"]) == (4, 2)
    assert sorted(e.key for e in scan_entries(cache_root)) == populated["keys"][:2]
    status, report = kcache_cli(cache_root, "clear")  # synthetic entries name no TileLang version: kept
    assert status == 0 and report["removed_entries"] == 0
    status, report = kcache_cli(cache_root, "clear", "--all-versions")
    assert status == 0 and report["removed_entries"] == 2 and scan_entries(cache_root) == []


def test_counts_in_words_agree_with_their_nouns(cache_root: Path, populated: dict) -> None:
    def text(*args: str) -> str:
        done = subprocess.run([sys.executable, "-m", "kcache", "--dir", str(cache_root), *args], capture_output=True,
                              text=True, env=child_env(), cwd=str(PROJECT), check=False)
        return done.stdout + done.stderr

    assert "6 entries match ''" in text("show", "")
    sizes = sorted(e.size for e in scan_entries(cache_root))
    assert text("prune", "--max-size", str(sum(sizes) - 1)).startswith("evicted 1 entry (")
    assert "removed 5 kernel entries, 0 autotune results, 0 Triton entries and 0 Helion picks (every version)" in text(
        "clear", "--all-versions")


def test_gc_removes_compile_logs_older_than_a_week_and_keeps_newer_ones(cache_root: Path, populated: dict) -> None:
    logs = cache_root / ".logs"
    logs.mkdir(exist_ok=True)
    (logs / "old.log").write_text("error: ...")
    (logs / "new.log").write_text("error: ...")
    eight_days = time.time() - 8 * 86400
    os.utime(logs / "old.log", (eight_days, eight_days))
    status, report = kcache_cli(cache_root, "gc")
    assert status == 0 and report["logs_removed"] == 1
    # The populating compiles logged their misses there too (kcache why-miss): a fresh log, kept.
    assert sorted(name for name in os.listdir(logs) if not name.startswith("misses-")) == ["new.log"]


def test_doctor_finds_and_fixes_a_world_writable_root(cache_root: Path, populated: dict) -> None:
    status, findings = kcache_cli(cache_root, "doctor")
    by_check = {f["check"]: f for f in findings}
    assert by_check["leftovers"]["problem"]  # the partial write's staging
    cache_root.chmod(0o777)
    status, findings = kcache_cli(cache_root, "doctor")
    assert status == 1 and {f["check"]: f for f in findings}["mode"]["problem"]
    status, findings = kcache_cli(cache_root, "doctor", "--fix")
    assert not stat.S_IMODE(cache_root.stat().st_mode) & stat.S_IWOTH
    assert all(f["fixed"] for f in findings if f["problem"] and f["check"] in ("mode", "leftovers"))
    status, findings = kcache_cli(cache_root, "doctor")
    assert [f["check"] for f in findings if f["problem"]] in ([], ["toolchain"])
    assert status == (1 if any(f["problem"] for f in findings) else 0)


def test_the_cli_never_imports_tilelang_and_stats_works_on_an_empty_root(tmp_path: Path) -> None:
    (tmp_path / "root").mkdir()
    code = ("import sys, contextlib, io\nfrom kcache.cli.main import main\n"
            f"for cmd in (['stats'], ['ls'], ['verify'], ['gc'], ['doctor'], ['prune']):\n"
            f"    with contextlib.redirect_stdout(io.StringIO()):\n"
            f"        main(['--dir', {str(tmp_path / 'root')!r}, *cmd])\n"
            "print('tilelang' in sys.modules, 'tvm' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=child_env(),
                          cwd=str(PROJECT), check=True)
    assert done.stdout.split() == ["False", "False"]


# --dir and --json before the command, after it, or split around it: where a ccache or git user puts them.
PLACEMENTS = {
    "before": lambda root, command: ["--dir", root, "--json", *command],
    "after": lambda root, command: [*command, "--json", "--dir", root],
    "dir before, json after": lambda root, command: ["--dir", root, *command, "--json"],
    "json before, dir after": lambda root, command: ["--json", *command, "--dir", root],
}


@pytest.mark.parametrize("placement", PLACEMENTS)
def test_dir_and_json_work_before_and_after_the_command(cache_root: Path, populated: dict, tmp_path: Path,
                                                        placement: str) -> None:
    place = PLACEMENTS[placement]
    root = str(cache_root)
    status, stats = kcache_json(*place(root, ["stats"]))
    assert status == 0 and stats["root"] == root and stats["entries"] == 6 and stats["compiles"] == 6
    status, listing = kcache_json(*place(root, ["ls"]))
    assert status == 0 and sorted(e["key"] for e in listing) == populated["keys"]
    status, report = kcache_json(*place(root, ["verify"]))
    assert status == 1 and [b["key"] for b in report["bad"]] == [populated["corrupt"]]
    assert report["staging_in_progress"] == 1
    status, report = kcache_json(*place(root, ["verify", "--repair"]))
    assert status == 0 and report["bad"][0]["quarantined"]
    status, report = kcache_json(*place(root, ["gc"]))
    assert status == 0 and report["staging_removed"] == 1 and report["stats_folded"] == 1
    assert not (tmp_path / "default-kcache").exists()  # $KCACHE_DIR, where an ignored --dir would have gone


def test_the_option_after_the_command_wins(cache_root: Path, populated: dict, tmp_path: Path) -> None:
    other = tmp_path / "other-root"
    other.mkdir()
    status, stats = kcache_json("--dir", str(other), "stats", "--dir", str(cache_root), "--json")
    assert status == 0 and (stats["root"], stats["entries"]) == (str(cache_root), 6)
    status, stats = kcache_json("--json", "--dir", str(cache_root), "stats", "--dir", str(other))
    assert status == 0 and (stats["root"], stats["entries"]) == (str(other), 0)
    status, listing = kcache_json("--json", "ls", "--json", "--dir", str(cache_root))  # given twice: still JSON
    assert status == 0 and len(listing) == 6


def test_without_json_the_output_is_a_table(cache_root: Path, populated: dict) -> None:
    done = subprocess.run([sys.executable, "-m", "kcache", "stats", "--dir", str(cache_root)], capture_output=True,
                          text=True, env=child_env(), cwd=str(PROJECT), check=True)
    rows = dict(line.split(maxsplit=1) for line in done.stdout.splitlines()[:2])
    assert rows == {"root": str(cache_root), "entries": "6"}, done.stdout


COMMANDS = ("stats", "config", "ls", "show", "verify", "prune", "clear", "export", "import", "verify-coverage", "why-miss",
            "tunes", "untune", "gc", "doctor", "server", "run", "help")


def test_every_command_help_lists_dir_and_json(capsys: pytest.CaptureFixture[str]) -> None:
    subparsers = next(a for a in build_parser()._actions if a.dest == "command")
    assert sorted(subparsers.choices) == sorted(COMMANDS)
    for command in COMMANDS:
        with pytest.raises(SystemExit) as exited:
            main([command, "--help"])
        shown = capsys.readouterr().out
        assert exited.value.code == 0 and shown.startswith(f"usage: kcache {command} "), shown
        options = shown[shown.index("options:"):]
        assert "--dir ROOT" in options and "--json" in options, (command, shown)


@pytest.mark.parametrize("argv, module, program_argv", [
    (["run", "train.py", "--json", "--dir", "x"], None, ["train.py", "--json", "--dir", "x"]),
    (["run", "train.py", "-m", "y", "--", "z"], None, ["train.py", "-m", "y", "--", "z"]),
    (["run", "-m", "pkg.main", "--json", "--dir", "x"], ["pkg.main", "--json", "--dir", "x"], []),
    (["run", "-mpkg.main", "a"], ["pkg.main"], ["a"]),
])
def test_run_leaves_the_program_its_arguments(argv: list[str], module: list[str] | None,
                                              program_argv: list[str]) -> None:
    for before in ([], ["--dir", "outer", "--json"]):
        args = build_parser().parse_args([*before, *argv])
        assert (args.module, args.argv) == (module, program_argv)
        assert args.dir == ("outer" if before else None)  # kcache's own, before the script: unchanged


PROGRAM = """import json, os, sys
import tilelang  # kcache installs into TileLang at its import (issue 58): "installed" below says it did
print("PROGRAM " + json.dumps({"argv": sys.argv[1:], "root": os.environ.get("KCACHE_DIR"), "name": __name__,
                               "installed": "kcache" in sys.modules and sys.modules["kcache"].is_installed()}))
"""


@pytest.mark.skipif(importlib.util.find_spec("tilelang") is None, reason="`kcache run` installs into TileLang")
@pytest.mark.parametrize("form", ["script", "module"])
def test_kcache_run_passes_dir_and_json_after_the_script_to_it(tmp_path: Path, form: str) -> None:
    (tmp_path / "the_program.py").write_text(PROGRAM)
    target = [str(tmp_path / "the_program.py")] if form == "script" else ["-m", "the_program"]
    passed = ["--json", "--dir", "not-a-root", "-m", "x", "--", "y"]
    root = tmp_path / "run-root"
    done = subprocess.run([sys.executable, "-m", "kcache", "--dir", str(tmp_path / "outer"), "run", "--dir", str(root),
                           *target, *passed], capture_output=True, text=True, env=child_env(), cwd=str(tmp_path))
    lines = [line for line in done.stdout.splitlines() if line.startswith("PROGRAM ")]
    assert done.returncode == 0 and lines, done.stderr[-3000:]
    seen = json.loads(lines[-1][len("PROGRAM "):])
    assert seen == {"argv": passed, "root": str(root), "name": "__main__", "installed": True}
