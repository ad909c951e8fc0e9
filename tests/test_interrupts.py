"""Long commands stopped by a real SIGINT or SIGTERM (issue 37): each answers with one line that says
what was done and where what it kept is, exits 128 + the signal, and leaves no process of its own
running. The signal goes to the command's process alone (as `kill` sends it; a Ctrl-C reaches its whole
process group, which the command's workers are not in), once the command is under way: its start
line read, its compile service's socket there, its pause hook reached."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from kcache.store.components import COMPONENTS, KERNELS
from kcache.store.entries import EntryStore

from .helpers import PROJECT, child_env
from .leftovers import Scratch, processes_of, wait_for
from .test_bundles import SECRET, filled_root

SIGNALS = [signal.SIGINT, signal.SIGTERM]


def start(argv: list[str], scratch: Scratch, **env: str) -> subprocess.Popen[str]:
    """The command, its stdout and stderr on one pipe (read line by line: what it printed after the
    signal is what follows the lines read before it)."""
    return subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=child_env(**scratch.env, **env), cwd=str(PROJECT))


def stopped_by(child: subprocess.Popen[str], signum: int) -> list[str]:
    """Send `signum` to the child alone; the lines it printed after, once it exited."""
    os.kill(child.pid, signum)
    return rest_of(child, 128 + signum)


def rest_of(child: subprocess.Popen[str], status: int, within: float = 180) -> list[str]:
    """What the child prints until it exits (within `within` seconds, or the test fails: a command that
    hangs on a signal is what the old harness did), its lines; it must exit with `status`."""
    said: list[str] = []
    reader = threading.Thread(target=lambda: said.append(child.stdout.read()), daemon=True)
    reader.start()
    reader.join(within)
    if reader.is_alive():
        raise AssertionError(f"the command had not ended {within:g} s after the signal")
    assert child.wait() == status, said[0]
    assert "Traceback" not in said[0], said[0]
    return [line for line in said[0].splitlines() if line.strip()]


def compile_service(scratch: Scratch, *, whole: bool = False) -> bool:
    """Whether a compile server carrying the command's mark runs (the one its workers, or it, started);
    `whole`: with its worker template and a worker."""
    names = {line.split()[1].rstrip(":") for line in processes_of(scratch)}
    return {"kcache-server", "kcache-template", "kcache-worker"} <= names if whole else "kcache-server" in names


@pytest.mark.parametrize("signum", SIGNALS, ids=lambda s: signal.Signals(s).name)
def test_an_interrupted_stress_run_says_one_line_keeps_its_logs_and_leaves_nothing(scratch: Scratch,
                                                                                   signum: int) -> None:
    run = start([sys.executable, "-m", "stress", "--synthetic", "--procs", "2", "--duration", "600", "--quiet",
                 "--seed", "7"], scratch)
    wait_for(lambda: compile_service(scratch, whole=True), run, "the run's compile service, its template and a worker")
    first, *after = stopped_by(run, signum)
    assert processes_of(scratch) == []  # its workers, its compile service, the service's template and workers
    root = Path(re.search(r"root (\S+) \(throwaway", first).group(1))
    runtime = Path(re.search(r"compile services in (\S+)", first).group(1))
    (line,) = after
    name = signal.Signals(signum).name
    assert re.match(rf"stress: interrupted by {name} after \d+ s of load, \d+ operations by 2 workers, ", line), line
    logs = Path(re.search(r"workers' logs kept in (\S+);", line).group(1))
    assert list(logs.glob("worker-*.jsonl")) and f"throwaway root {root} removed" in line
    assert not root.exists() and not runtime.exists()
    assert os.listdir(scratch.path) == [logs.name]


def workers_loading(scratch: Scratch) -> bool:
    return sum(" stress.worker" in line or "stress/worker" in line for line in processes_of(scratch)) >= 2


# The moments of a run at which a terminal's Ctrl-C can come: as it starts (its first line printed, its
# temporary folders made, nothing else yet), with its compile service up, and under load.
MOMENTS = {
    "starting": lambda scratch: True,
    "service up": lambda scratch: compile_service(scratch, whole=True),
    "under load": lambda scratch: compile_service(scratch, whole=True) and workers_loading(scratch),
}


@pytest.mark.parametrize("moment", sorted(MOMENTS))
def test_ctrl_c_to_the_stress_runs_process_group_at_any_moment_leaves_nothing(scratch: Scratch, moment: str) -> None:
    """A terminal's Ctrl-C: SIGINT to the whole foreground process group (the run leads its own here,
    as a shell's job does), at one of the run's moments. One line, exit 130, nothing left running, and
    of what it made only its logs."""
    run = subprocess.Popen([sys.executable, "-m", "stress", "--synthetic", "--procs", "2", "--duration", "600",
                            "--quiet", "--seed", "7"], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, env=child_env(**scratch.env), cwd=str(PROJECT),
                           start_new_session=True)
    first = run.stdout.readline()
    assert first.startswith("stress:"), first + run.stdout.read()
    wait_for(lambda: MOMENTS[moment](scratch), run, f"the run's moment {moment!r}")
    os.killpg(run.pid, signal.SIGINT)
    *_, line = rest_of(run, 128 + signal.SIGINT)
    assert processes_of(scratch) == []
    assert line.startswith("stress: interrupted by SIGINT "), line
    assert len(os.listdir(scratch.path)) <= 1 and all(name.startswith("kcache-stress-") or "log" in name
                                                         for name in os.listdir(scratch.path)), os.listdir(scratch.path)


@pytest.mark.parametrize("signum", SIGNALS, ids=lambda s: signal.Signals(s).name)
def test_an_interrupted_bench_says_what_it_measured_and_leaves_nothing(scratch: Scratch, signum: int) -> None:
    bench = start([sys.executable, "-m", "stress.bench", "--only", "cli", "--cli-entries", "20000"], scratch)
    wait_for(lambda: compile_service(scratch), bench, "the compile service of the cli scenario's entries")
    first, *after = stopped_by(bench, signum)
    assert processes_of(scratch) == []
    work = Path(re.search(r"work directory (\S+);", first).group(1))
    name = signal.Signals(signum).name
    assert after == ["cli: measuring", f"stress.bench: interrupted by {name} during cli: 0 rows measured (no scenario "
                                       f"finished); work directory {work} removed"]
    assert os.listdir(scratch.path) == []


# The real CLI (kcache.cli.main.main) in a fresh interpreter, paused at a known point of its work until
# the test sends its signal: the third entry sent to a stager process, the third member of the bundle
# written, the first rename of an import's publish.
PAUSED_CLI = """
import sys
from kcache.bundle import export as bundle_export
from kcache.bundle import importer as bundle
from kcache.bundle import stager as bundle_stager
from kcache.cli.main import main
from kcache.store.entries import EntryStore

where, argv = sys.argv[1], sys.argv[2:]
calls = []

def pause(word):
    calls.append(word)
    if len(calls) == (1 if word == "renamed" else 3):
        print(word, flush=True)
        sys.stdin.readline()  # the test's signal comes here

if where == "staging":
    bundle.stager_count = lambda entries, size: 2  # a large bundle's way: stager processes
    submit = bundle_stager.ProcessStaging.submit
    def submit_then_pause(self, *args):
        submit(self, *args)
        pause("staging")
    bundle_stager.ProcessStaging.submit = submit_then_pause
elif where == "writing":
    add = bundle_export._add
    def add_then_pause(*args):
        add(*args)
        pause("writing")
    bundle_export._add = add_then_pause
else:
    EntryStore.fault_hook = staticmethod(lambda step: pause(step) if step == where else None)
sys.exit(main(argv))
"""


def paused_cli(scratch: Scratch, where: str, *argv: str) -> subprocess.Popen[str]:
    child = start([sys.executable, "-c", PAUSED_CLI, where, *argv], scratch, KCACHE_BUNDLE_SECRET=SECRET)
    said = child.stdout.readline()
    assert said.strip() == where, said + child.stdout.read()
    return child


def visible(root: Path) -> list[str]:
    return sorted(EntryStore(root, KERNELS, COMPONENTS).keys()) if (root / KERNELS).exists() else []


@pytest.fixture
def signed_bundle(tmp_path: Path) -> tuple[Path, list[str]]:
    keys = filled_root(tmp_path / "a")
    path = tmp_path / "kernels.kcb"
    done = subprocess.run([sys.executable, "-m", "kcache", "--dir", str(tmp_path / "a"), "export", str(path)],
                          capture_output=True, text=True, env=child_env(KCACHE_BUNDLE_SECRET=SECRET), cwd=str(PROJECT))
    assert done.returncode == 0, done.stderr
    return path, keys


@pytest.mark.parametrize("signum", SIGNALS, ids=lambda s: signal.Signals(s).name)
def test_an_interrupted_import_imports_nothing_and_stops_its_stagers(tmp_path: Path, scratch: Scratch,
                                                                     signed_bundle: tuple[Path, list[str]],
                                                                     signum: int) -> None:
    path, _keys = signed_bundle
    root = tmp_path / "b"
    child = paused_cli(scratch, "staging", "--dir", str(root), "import", str(path), "--any-toolchain")
    assert len(processes_of(scratch)) == 3  # the importer and its two stager processes, under way
    (line,) = stopped_by(child, signum)
    assert line == (f"kcache import: interrupted by {signal.Signals(signum).name}: nothing was imported into {root} "
                    f"(what was staged of {path} was removed)")
    assert visible(root) == [] and os.listdir(root / ".staging") == []
    assert processes_of(scratch) == []


def test_an_import_interrupted_during_its_renames_finishes_them_then_says_so(
        tmp_path: Path, scratch: Scratch, signed_bundle: tuple[Path, list[str]]) -> None:
    """The renames make the bundle visible: all of them or none. A signal among them waits for the last."""
    path, keys = signed_bundle
    root = tmp_path / "b"
    child = paused_cli(scratch, "renamed", "--dir", str(root), "import", str(path), "--any-toolchain")
    os.kill(child.pid, signal.SIGINT)  # acted on once the renames are done: the pause goes on till then
    child.stdin.write("\n")
    child.stdin.flush()
    assert rest_of(child, 130) == [
        f"kcache import: interrupted by SIGINT: its renames were under way, and finished first: imported "
        f"{len(keys)} entries into {root}, 0 already there"]
    assert visible(root) == keys and os.listdir(root / ".staging") == []


@pytest.mark.parametrize("signum", SIGNALS, ids=lambda s: signal.Signals(s).name)
def test_an_interrupted_export_writes_no_bundle_and_leaves_no_partial_file(tmp_path: Path, scratch: Scratch,
                                                                           signum: int) -> None:
    filled_root(tmp_path / "a")
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    bundle = out_dir / "kernels.kcb"
    child = paused_cli(scratch, "writing", "--dir", str(tmp_path / "a"), "export", str(bundle))
    (line,) = stopped_by(child, signum)
    assert line == (f"kcache export: interrupted by {signal.Signals(signum).name}: no bundle was written ({bundle} "
                    "is as it was; its partial file was removed)")
    assert os.listdir(out_dir) == []
