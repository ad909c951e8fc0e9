"""A newcomer's first hour with `kcache` (issue 37): a size that is measured now (or says when it was),
`show` and `ls` that a person can read, one key width, `--version` and `help`, settings that flag
their typos and share one duration syntax, 0 as "no limit", and advice that fits a read-only
filesystem. Every command runs in a fresh interpreter, as a user runs it."""

from __future__ import annotations

import json
import platform
import re
import subprocess
import sys
from pathlib import Path

import pytest

import kcache
from kcache.config import Settings
from kcache.maintenance.eviction import scan_entries
from kcache.results.autotune import AutotuneResult, result_path

from .faults import needs_root, readonly_bind
from .helpers import PROJECT, child_env
from .test_eviction import POPULATE


def kcache_run(*argv: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kcache", *argv], capture_output=True, text=True,
                          env=child_env(**env), cwd=str(PROJECT), timeout=300, check=False)


def kcache_json(*argv: str, **env: str) -> object:
    done = kcache_run("--json", *argv, **env)
    assert done.returncode in (0, 1), done.stderr
    return json.loads(done.stdout)


def populate(root: Path, names: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", POPULATE.format(root=str(root), names=names)], capture_output=True,
                          text=True, env=child_env(), cwd=str(PROJECT), check=True)


# ---------------------------------------------------------------- stats: the size


def test_stats_measures_the_size_now_not_at_the_last_gc(cache_root: Path) -> None:
    populate(cache_root, ["k0", "k1"])
    assert kcache_run("--dir", str(cache_root), "gc").returncode == 0  # records the size of 2 entries
    populate(cache_root, ["k2", "k3", "k4"])
    stats = kcache_json("--dir", str(cache_root), "stats")
    assert stats["entries"] == 5 and stats["size_bytes"] == sum(e.size for e in scan_entries(cache_root))
    assert stats["size_is_live"] is True and "size_measured" not in stats  # the old key held a time
    assert isinstance(stats["size_measured_at"], float)
    text = kcache_run("--dir", str(cache_root), "stats").stdout
    assert re.search(r"^size +\S+ KiB of 10\.0 GiB \(measured now\)$", text, re.M), text


def test_stats_of_a_root_too_big_to_measure_says_as_of_when(cache_root: Path) -> None:
    """Above LIVE_SIZE_MAX_ENTRIES (lowered here to 1), stats shows what the last gc measured, with its
    clock time, and says how to measure again."""
    populate(cache_root, ["k0"])
    kcache_run("--dir", str(cache_root), "gc")
    populate(cache_root, ["k1", "k2"])
    code = ("import sys\nimport kcache.cli.stats as entries\nentries.LIVE_SIZE_MAX_ENTRIES = 1\n"
            "from kcache.cli.main import main\nsys.exit(main(sys.argv[1:]))")
    done = subprocess.run([sys.executable, "-c", code, "--dir", str(cache_root), "stats"], capture_output=True,
                          text=True, env=child_env(), cwd=str(PROJECT), check=True)
    (size,) = [line for line in done.stdout.splitlines() if line.startswith("size ")]
    assert re.search(r"of 1 entry of 10\.0 GiB, as of \d{4}-\d\d-\d\d \d\d:\d\d:\d\d ", size), size
    assert "by the last gc or prune" in size and "3 entries are too many" in size and "`kcache gc`" in size


# ---------------------------------------------------------------- ls, show, tunes


@pytest.fixture(scope="module")
def same_named_kernels(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two real TileLang kernels that are both called "add": one for 1024 floats, one for 2048."""
    root = tmp_path_factory.mktemp("newcomer") / "root"
    code = ("import kcache\nfrom stress.programs.kernels import CPU_TARGET, elementwise_add\n"
            f"cache = kcache.KernelCache({str(root)!r})\n"
            "for n in (1024, 2048):\n"
            "    cache.get_or_compile(elementwise_add(n=n).with_attr('global_symbol', 'add'), CPU_TARGET, out_idx=[2])\n")
    subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=str(PROJECT), check=True,
                   env=child_env(KCACHE_COMPILE_ISOLATION="inprocess", TILELANG_CACHE_DIR=str(root.parent / "tl")))
    return root


@pytest.mark.tilelang
def test_ls_tells_apart_entries_of_one_kernel_name(same_named_kernels: Path) -> None:
    listing = kcache_json("--dir", str(same_named_kernels), "ls")
    assert [e["kernel"] for e in listing] == ["add", "add"]
    shapes = sorted(tuple(p["shape"] for p in e["params"]) for e in listing)
    assert shapes == [(["1024"],) * 3, (["2048"],) * 3] and all(e["out_idx"] == [2] for e in listing)
    lines = kcache_run("--dir", str(same_named_kernels), "ls").stdout.splitlines()
    assert lines[0].split()[:5] == ["key", "kind", "kernel", "params", "out_idx"]
    rows = [line.split(None, 1)[1] for line in lines[1:]]  # everything but the key
    assert len(set(rows)) == 2, lines
    assert sorted(re.search(r"float32\[\d+\] x3", row).group(0) for row in rows) == ["float32[1024] x3",
                                                                                      "float32[2048] x3"]


@pytest.mark.tilelang
def test_show_gives_a_summary_first_then_each_detail_once(same_named_kernels: Path) -> None:
    key = scan_entries(same_named_kernels)[0].key
    meta = json.loads((same_named_kernels / "kernels" / key / "meta.json").read_text())
    text = kcache_run("--dir", str(same_named_kernels), "show", key[:8]).stdout
    lines = text.splitlines()
    assert [line.split()[0] for line in lines[:8]] == ["kernel", "key", "params", "out_idx", "target", "created",
                                                       "size", "path"], text
    summary = dict(line.split(None, 1) for line in lines[:8])
    assert summary["kernel"] == "add" and summary["key"] == key and summary["target"] == "sm_90a"
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \S+ \(\d+ (s|min) ago\)", summary["created"])
    assert re.fullmatch(r"\S+ KiB in 7 files", summary["size"])
    assert str(int(meta["created"])) not in text  # no raw epoch time
    assert text.count('"arch":"sm_90a"') == 1 and text.count(meta["toolchain"]["nvcc"]) == 1  # once each
    assert len(lines) < 45, text
    shown = kcache_json("--dir", str(same_named_kernels), "show", key[:8])
    assert shown["summary"]["created_at"] == meta["created"] and shown["summary"]["files"] == 7


def test_every_command_shows_keys_16_digits_wide(cache_root: Path) -> None:
    populate(cache_root, ["k0"])
    tune_key = "ab" * 20
    AutotuneResult(config={"block": 128}, latency=0.1, func=None).save_to_disk(result_path(cache_root, tune_key))
    entry_key = scan_entries(cache_root)[0].key
    for command, key in (("ls", entry_key), ("tunes", tune_key)):
        first_column = kcache_run("--dir", str(cache_root), command).stdout.splitlines()[1].split()[0]
        assert first_column == key[:16], (command, first_column)


# ---------------------------------------------------------------- --version, help


def test_version_and_help_answer_as_git_and_pip_do(tmp_path: Path) -> None:
    done = kcache_run("--version")
    assert done.returncode == 0 and done.stdout.startswith(f"kcache {kcache.__version__} from "), done.stdout
    assert str(Path(kcache.__file__).parent) in done.stdout
    assert kcache_run("help").stdout == kcache_run("--help").stdout
    helped = kcache_run("help", "prune")
    assert helped.returncode == 0 and helped.stdout == kcache_run("prune", "--help").stdout
    assert "0 means no limit" in helped.stdout
    wrong = kcache_run("help", "pruen")
    assert wrong.returncode == 2 and wrong.stdout == ""
    assert wrong.stderr.strip().splitlines() == [wrong.stderr.strip()] and "'pruen' is no kcache command" in wrong.stderr



def test_version_and_help_answer_in_json_under_json() -> None:
    """Every command answers --json in JSON (issue 68: --version and help printed text)."""
    for argv in (["--json", "--version"], ["--version", "--json"]):
        done = kcache_run(*argv)
        assert done.returncode == 0 and json.loads(done.stdout) == {
            "version": kcache.__version__, "location": str(Path(kcache.__file__).parent), "python": platform.python_version()}
    for argv, command in ((["--json", "help"], None), (["help", "prune", "--json"], "prune")):
        done = kcache_run(*argv)
        answer = json.loads(done.stdout)
        assert done.returncode == 0 and answer["command"] == command, answer
        text = kcache_run("help", *([command] if command else [])).stdout
        assert answer["help"] == text and answer["usage"].startswith(f"usage: kcache{' ' + command if command else ''} [")
        assert (answer["commands"] is None) is (command is not None)


# ---------------------------------------------------------------- settings


def test_a_misspelt_setting_is_flagged_once_with_the_setting_it_meant(cache_root: Path) -> None:
    typos = {"KCACHE_MAXSIZE": "1G", "KCACHE_LOCK_TIMOUT": "10"}
    opens_twice = (f"import kcache\nfrom stress.programs import synthetic\nfor _ in range(2):\n"
                   f"    kcache.KernelCache({str(cache_root)!r}, backend=synthetic)\n")
    done = subprocess.run([sys.executable, "-c", opens_twice], capture_output=True, text=True,
                          env=child_env(**typos), cwd=str(PROJECT), check=True)
    (warning,) = done.stderr.strip().splitlines()
    assert "KCACHE_MAXSIZE (did you mean KCACHE_MAX_SIZE?)" in warning, warning
    assert "KCACHE_LOCK_TIMOUT (did you mean KCACHE_LOCK_TIMEOUT?)" in warning
    assert "no effect" in warning and "unset them" in warning
    assert kcache_run("--dir", str(cache_root), "stats", **typos).stderr.count("did you mean KCACHE_MAX_SIZE?") == 1
    findings = kcache_json("--dir", str(cache_root), "doctor", KCACHE_MAXSIZE="1G")
    (flagged,) = [f for f in findings if f["check"] == "settings" and f["problem"]]
    assert "KCACHE_MAXSIZE (did you mean KCACHE_MAX_SIZE?)" in flagged["detail"] and flagged["fix"]
    clean = kcache_run("--dir", str(cache_root), "stats", KCACHE_MAX_SIZE="1G")
    assert clean.returncode == 0 and clean.stderr == ""


def test_every_kcache_variable_the_code_reads_is_known_and_documented() -> None:
    """The list of settings is what flags typos: a name kcache reads but the list lacks would be
    flagged as a typo, and a setting the table lacks is one a user cannot find."""
    from kcache.config import INTERNAL_NAMES, INTERNAL_PREFIX, SETTING_NAMES

    read = set()
    for package in ("kcache", "stress", "autotuner", "tests"):
        for path in (PROJECT / package).rglob("*.py"):
            read |= set(re.findall(r"[\"'](KCACHE_[A-Z0-9_]+)[\"']", path.read_text()))
    unknown = {name for name in read if name not in SETTING_NAMES | INTERNAL_NAMES and not name.startswith(INTERNAL_PREFIX)}
    assert unknown == {"KCACHE_MAXSIZE", "KCACHE_LOCK_TIMOUT"}, unknown  # this file's typos, on purpose
    operations = (PROJECT / "docs" / "operations.md").read_text()
    table = operations[operations.index("## Settings"):operations.index("## What you can change")]
    assert set(re.findall(r"^\| `(KCACHE_[A-Z0-9_]+)`", table, re.M)) == SETTING_NAMES


TIME_SETTINGS = {"KCACHE_LOCK_TIMEOUT": "lock_timeout_s", "KCACHE_TUNE_WAIT": "tune_wait_s",
                 "KCACHE_STAGING_TTL": "staging_ttl_s", "KCACHE_GC_INTERVAL": "gc_interval_s",
                 "KCACHE_COMPILE_TIMEOUT": "compile_timeout_s", "KCACHE_SERVER_IDLE": "server_idle_s",
                 "KCACHE_REMOTE_LEASE": "remote_lease_s", "KCACHE_MAX_AGE": "max_age_s",
                 "KCACHE_REMOTE_TTL": "remote_ttl_s"}


@pytest.mark.parametrize("variable", sorted(TIME_SETTINGS))
def test_every_time_setting_takes_the_same_units(variable: str, monkeypatch: pytest.MonkeyPatch,
                                                 tmp_path: Path) -> None:
    for text, seconds in (("90s", 90), ("15min", 900), ("15m", 900), ("2h", 7200), ("1d", 86400),
                          ("1w", 604800), ("3600", 3600), ("1.5h", 5400)):
        monkeypatch.setenv(variable, text)
        assert getattr(Settings.from_env(tmp_path), TIME_SETTINGS[variable]) == seconds, text
    done = kcache_run("--dir", str(tmp_path), "stats", **{variable: "15min"})
    assert done.returncode == 0 and done.stderr == "", done.stderr
    wrong = kcache_run("--dir", str(tmp_path), "stats", **{variable: "15 minutes"})
    assert wrong.returncode == 2 and "examples: 30d, 12h, 15min, 90s, 1w, 3600" in wrong.stderr


def test_prune_max_size_0_means_no_limit_even_when_the_setting_has_one(cache_root: Path) -> None:
    populate(cache_root, ["k0", "k1", "k2"])
    report = kcache_json("--dir", str(cache_root), "prune", "--max-size", "0", KCACHE_MAX_SIZE="1K")
    assert (report["evicted"], report["remaining"]) == (0, 3)  # not KCACHE_MAX_SIZE's 1K instead
    assert report["max_size_bytes"] is None
    text = kcache_run("--dir", str(cache_root), "prune", "--max-size", "0").stdout
    assert text.rstrip().endswith("limits: size no limit, age no limit"), text
    report = kcache_json("--dir", str(cache_root), "prune", KCACHE_MAX_SIZE="1K")  # left out: the setting
    assert (report["evicted"], report["max_size_bytes"]) == (3, 1024)


# ---------------------------------------------------------------- a root you cannot write


OPEN_AND_REPORT = """
import json, kcache
from stress.programs import synthetic
try:
    cache = kcache.KernelCache({root!r}, backend=synthetic)
    print(json.dumps({{"writes_to": str(cache.root)}}))
except kcache.UnwritableCache as err:
    print(json.dumps({{"error": str(err)}}))
"""


@needs_root
@pytest.mark.parametrize("policy", ["fallback", "readonly", "error"])
def test_a_read_only_filesystem_gets_advice_that_fits_it(cache_root: Path, tmp_path: Path, policy: str) -> None:
    populate(cache_root, ["k0"])
    env = {"KCACHE_ON_UNWRITABLE": policy, "XDG_CACHE_HOME": str(tmp_path / "xdg-cache")}
    with readonly_bind(cache_root):
        done = subprocess.run([sys.executable, "-c", OPEN_AND_REPORT.format(root=str(cache_root))], capture_output=True,
                              text=True, env=child_env(**env), cwd=str(PROJECT), check=True)
        findings = kcache_json("--dir", str(cache_root), "doctor", **env)
    outcome = json.loads(done.stdout)
    said = outcome.get("error") or done.stderr
    (writable,) = [f for f in findings if f["check"] == "writable"]
    assert "is on a read-only filesystem" in said, said
    for advice in (said, writable["fix"]):
        assert "a directory on a writable filesystem" in advice, advice
        assert "group" not in advice and "KCACHE_UMASK" not in advice, advice
        assert ("KCACHE_ON_UNWRITABLE=readonly" in advice) == (policy != "readonly"), advice
    if policy == "fallback":
        assert outcome["writes_to"] == str(tmp_path / "xdg-cache" / "kcache")


# ---------------------------------------------------------------- server status: a summary


def test_server_status_is_a_summary_and_running_means_the_service(runtime: Path) -> None:
    """`running 0` (the jobs running) read as "not running": the summary says the service runs and
    counts its jobs apart; the JSON's `running` is the service's, `jobs_running` its jobs."""
    assert kcache_run("server", "start").returncode == 0
    try:
        done = kcache_run("server", "status")
        assert done.returncode == 0, done.stderr
        first, *rest = done.stdout.splitlines()
        assert re.match(r"compile service running: pid \d+, up \d+ s, (warm|starting its first worker)$", first)
        assert [line.split()[0] for line in rest] == ["socket", "workers", "jobs", "exits"], done.stdout
        assert "None" not in done.stdout and "_bytes" not in done.stdout
        status = kcache_json("server", "status")
        assert status["running"] is True and status["jobs_running"] == 0 and status["socket"].startswith(str(runtime))
    finally:
        assert kcache_run("server", "stop").returncode == 0
    stopped = kcache_json("server", "status")
    assert stopped["running"] is False
