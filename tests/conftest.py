"""Shared fixtures. Real faults (tmpfs, read-only mounts) need root; see tests/faults.py."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from . import background
from .leftovers import Scratch, mounts_under, processes_of
from .reclaim import mark, reclaim
from .unprivileged import leftover_users, unprivileged_env  # noqa: F401 - unprivileged_env: a fixture (below)

# unprivileged_env is imported here, not into each module that uses it: a session fixture imported into N
# modules is N fixtures, and a run built N venvs (issue 68). Here it is one per run.

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


_MAIN_PID = os.getpid()


def _stop_the_run(signum: int, _frame: object) -> None:
    """SIGTERM (a CI timeout, `kill`) stops the run as Ctrl-C does: pytest then tears every fixture down
    (users, groups, venvs, mounts, services) and ends the session. In a fork of this process (a test's
    child) the signal does what it would have done: kill it."""
    if os.getpid() != _MAIN_PID:
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        return
    raise KeyboardInterrupt(f"stopped by {signal.Signals(signum).name}")


def pytest_configure(config: pytest.Config) -> None:
    if os.getpid() == _MAIN_PID and signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
        signal.signal(signal.SIGTERM, _stop_the_run)
        # A fork starts with the default again: a child in C code (a compile) must die at once.
        os.register_at_fork(after_in_child=lambda: signal.signal(signal.SIGTERM, signal.SIG_DFL))
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU (skipped, with the reason, where none is visible)")
    config.addinivalue_line("markers", "tilelang: compiles real TileLang kernels (slow: seconds each)")
    config.addinivalue_line("markers", "quick: the quick tier, no root nor apt (set by tests/conftest.py, not by hand)")


# The quick tier, `python -m pytest -m quick` (README, "Develop"): the modules whose tests need neither
# root nor apt (no test users, mounts or redis-server) and compile no real TileLang kernel, less the tests
# of theirs that are marked `tilelang` or use a fixture that needs the machine. Timed on the 2-core machine
# (docs/operations.md, "The tests"). Everything else runs in the full suite, the README's test command.
QUICK_MODULES = frozenset({
    "test_arch_safety", "test_arrivals", "test_autotune_store", "test_bench_cli", "test_bench_library",
    "test_bench_suite", "test_bench_plots", "test_bench_record", "test_bundles", "test_cli", "test_deployment",
    "test_eviction", "test_triton_stages", "test_settings_checked", "test_triton_shared_fronts", "test_triton_launcher_ahead", "test_triton_key_ahead", "test_triton_lone_modules", "test_triton_service_warmup", "test_cli_abbreviations", "test_message_table",
    "test_import_hooks", "test_interrupts", "test_layers", "test_locks", "test_machine_code", "test_maintenance",
    "test_packed_blob", "test_readonly", "test_run", "test_store_stateful", "test_toolchain", "test_trust",
    "test_user_errors", "test_why_miss", "test_pool_close", "test_pool_spares", "test_service_scheduler", "test_tune_trials",
    "test_tunes_profile", "test_service_job_cost", "test_triton_compile_cost",
})
NEEDS_THE_MACHINE = frozenset({"unprivileged_env", "world_dir", "redis_url", "remote"})


@pytest.hookimpl(tryfirst=True)  # before `-m` selects by marker
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        module = getattr(item, "module", None)
        if (module is not None and module.__name__.rpartition(".")[2] in QUICK_MODULES
                and item.get_closest_marker("tilelang") is None
                and not NEEDS_THE_MACHINE & set(getattr(item, "fixturenames", ()))):
            item.add_marker(pytest.mark.quick)


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session: pytest.Session) -> None:
    background.order(session.items)  # the selected tests whose drivers run beside the others go last


_BASE_TEMP: list[Path] = []  # this session's pytest temporary directory, where the tests mount


def pytest_sessionstart(session: pytest.Session) -> None:
    """What sessions killed outright left (tests/reclaim.py) is removed before this one starts."""
    if os.geteuid() == 0:
        removed = reclaim()
        if removed:
            session.config.get_terminal_writer().line(f"reclaimed what killed test sessions left: {', '.join(removed)}")


@pytest.fixture(scope="session", autouse=True)
def _base_temp(tmp_path_factory: pytest.TempPathFactory) -> None:
    _BASE_TEMP.append(tmp_path_factory.getbasetemp())
    mark(_BASE_TEMP[-1])  # its mounts are unmounted by the next session if this one is killed outright


def pytest_sessionfinish(session: pytest.Session) -> None:
    """The machine as the session found it: a mount under the session's temporary directory, or a user or
    group that test sessions created and no running session holds (tests/unprivileged.py), fails the run."""
    left = [f"mount {point}" for base in _BASE_TEMP for point in mounts_under(base)]
    left += [f"user or group {name}" for name in leftover_users()]
    if left:
        session.config.get_terminal_writer().line(
            f"FAILED: the tests left the machine changed: {', '.join(left)}", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.fixture(scope="session", autouse=True)
def _session_runtime() -> Iterator[None]:
    """The compile services that tests start by default (KCACHE_COMPILE_ISOLATION's default is `server`)
    live in a runtime directory of this session's own, exit after a minute idle, and are stopped at
    its end: nothing of the suite's keeps running, and no test reaches the developer's service."""
    from stress.procs import environ
    from stress.service_runtime import stop_services

    directory = Path(tempfile.mkdtemp(prefix="ks-", dir="/tmp"))  # short: a socket's path has 107 bytes
    mark(directory)  # its services are stopped by the next session if this one is killed outright
    with environ({"XDG_RUNTIME_DIR": str(directory), "KCACHE_SERVER_IDLE": "60"}):
        yield
    stop_services(directory, wait=False)


@pytest.fixture(scope="session", autouse=True)
def _background_drivers(_session_runtime: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The slow differential drivers this session's tests wait on, started now at a low priority
    (tests/background.py); whatever of theirs is still running at the end is stopped."""
    background.start_wanted(tmp_path_factory)
    yield
    background.stop_all()


@pytest.fixture
def cache_root(tmp_path: Path) -> Path:
    root = tmp_path / "kcache-root"
    root.mkdir()
    return root


@pytest.fixture(autouse=True)
def _isolated_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Never touch the developer's real caches, TileLang's included.
    monkeypatch.setenv("KCACHE_DIR", str(tmp_path / "default-kcache"))
    monkeypatch.setenv("TILELANG_CACHE_DIR", str(tmp_path / "tilelang-cache"))
    monkeypatch.delenv("KCACHE_LOCK_TIMEOUT", raising=False)
    os.environ.setdefault("PYTHONUNBUFFERED", "1")


@pytest.fixture
def runtime(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A private runtime directory (XDG_RUNTIME_DIR) of this test's own: the compile services it
    starts are its own, and stopped at its end. Its jobs go to the service, never to a fork of the
    test's process, which the service's tests would not test (KCACHE_CALLER_FORK=0: the fork has
    tests of its own, tests/test_caller_fork.py)."""
    from stress.service_runtime import stop_services

    directory = Path(tempfile.mkdtemp(prefix="kr-", dir="/tmp"))  # short: a socket's path has 107 bytes
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(directory))
    monkeypatch.setenv("KCACHE_CALLER_FORK", "0")
    yield directory
    stop_services(directory, wait=False)  # what the test left running


@pytest.fixture
def scratch() -> Iterator[Scratch]:
    """A short temporary directory and a leftover mark of this test's own (tests/leftovers.py). Whatever
    carries the mark when the test ends is killed (a failed test must not leave a compile service
    running), and the directory is removed."""
    made = Scratch(Path(tempfile.mkdtemp(prefix="kt-", dir="/tmp")))
    yield made
    for line in processes_of(made):
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(line.split()[0]), signal.SIGKILL)
    shutil.rmtree(made.path, ignore_errors=True)
