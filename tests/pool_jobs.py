"""Jobs for the compile pool's tests: importable, so that workers load them by reference."""

from __future__ import annotations

import ctypes
import os
import sys
import threading


def double(x: int) -> int:
    return 2 * x


def worker_pid() -> int:
    return os.getpid()


def abort(message: str = "") -> None:
    if message:
        print(message, file=sys.stderr, flush=True)
    os.abort()


def segfault() -> None:
    ctypes.string_at(0)


def hang() -> None:
    threading.Event().wait()  # never set: the job outlives any timeout


def read_fifo(path: str) -> str:
    """Blocks until the test writes to the FIFO at `path`: a job that is running, held by the test."""
    with open(path) as fifo:
        return fifo.read()


def raise_value_error() -> None:
    raise ValueError("a bad config")


def install_faulty_compiler() -> None:
    """Make `kcache.tilelang.compiler.compile_kernel` abort or hang for the kernel named in the environment.

    Preloaded by a test's pool (module `tests.pool_jobs_faulty`), so the fault
    fires inside a real worker, in the middle of a real get_or_compile.
    """
    from kcache.tilelang import compiler as tilelang_compile
    from kcache.tilelang.backend import kernel_name

    original = tilelang_compile.compile_kernel

    def faulty(func, *args, **kwargs):  # noqa: ANN001, ANN202 - same signature as compile_kernel
        name = kernel_name(func)
        if name == os.environ.get("KCACHE_TEST_ABORT_KERNEL"):
            abort(f"injected abort while compiling {name}")
        if name == os.environ.get("KCACHE_TEST_HANG_KERNEL"):
            hang()
        return original(func, *args, **kwargs)

    tilelang_compile.compile_kernel = faulty


def tell_pid_and_hang(fifo: str) -> None:
    """Writes this worker's pid into the FIFO at `fifo` (the test reads it: the job is running), then hangs."""
    with open(fifo, "w") as out:
        out.write(str(os.getpid()))
    hang()


def parent_pid() -> int:
    return os.getppid()


def call_back(name: str) -> object:
    """Call the caller's function `name` from the job, in the caller's process."""
    from kcache.compile.workers.worker import call_caller

    return call_caller(name, ())


def write_output(directory: str, fifo: str, runs: str, started: str | None = None) -> int:
    """A job with an output: tells its pid (into the FIFO `started`, if given), waits for the test (the
    FIFO `fifo`), counts its run in the file `runs`, writes two files into `directory` (what a compile
    job does with its staging directory); its pid."""
    if started is not None:
        with open(started, "w") as tell:
            tell.write(str(os.getpid()))
    with open(fifo) as gate:
        gate.read()
    with open(runs, "a") as count:
        count.write("run\n")
    for name, data in (("kernel.so", b"\x7fELF library"), ("meta.json", b'{"key": 1}')):
        with open(os.path.join(directory, name), "wb") as out:
            out.write(data)
        os.chmod(os.path.join(directory, name), 0o444)
    return os.getpid()


def gated_run(fifo: str, runs: str) -> int:
    """A job whose output is its result alone: waits for the test (the FIFO `fifo`), counts its run in
    the file `runs`; its pid."""
    with open(fifo) as gate:
        gate.read()
    with open(runs, "a") as count:
        count.write("run\n")
    return os.getpid()


def string_hash(text: str) -> int:
    """`hash(text)` in the worker: its interpreter's hash seed (PYTHONHASHSEED)."""
    return hash(text)


def environment(*names: str) -> dict[str, str | None]:
    return {name: os.environ.get(name) for name in names}


class NeedsTwoArguments(Exception):
    """An exception that pickles but cannot be rebuilt: its constructor wants two arguments and passes
    one to Exception, so unpickling calls it with one."""

    def __init__(self, first: str, second: str) -> None:
        super().__init__(first)
        self.second = second


def raise_unrebuildable() -> None:
    raise NeedsTwoArguments("the first", "the second")


def new_file_mode(path: str) -> tuple[int, int]:
    """Create `path` asking for 0o666, as a compile writes its outputs: its mode (the umask decides)
    and the worker's pid."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    os.close(fd)
    return os.stat(path).st_mode & 0o777, os.getpid()


_REMEMBERED: list[object] = []


def remember(value: object) -> int:
    """Leave something behind in the worker: a module global, and a module imported."""
    import tests.pool_jobs_left_behind  # noqa: F401 - imported only by this job

    _REMEMBERED.append(value)
    return len(_REMEMBERED)


def what_was_left_behind() -> tuple[list[object], bool]:
    """What an earlier job left in this worker: its global, and whether its module is imported."""
    return list(_REMEMBERED), "tests.pool_jobs_left_behind" in sys.modules


def linger_at_exit(seconds: float) -> int:
    """Make this worker take `seconds` to exit once its job pipe closes, as a worker whose large address
    space takes long to unmap does, and return its pid."""
    from kcache.compile import protocol

    receive = protocol.recv_bytes

    def lingering(fd: int) -> bytes:
        try:
            return receive(fd)
        except EOFError:
            threading.Event().wait(seconds)  # the slow exit under test, not a synchronization
            raise

    protocol.recv_bytes = lingering
    return os.getpid()


def append_line(path: str, line: str) -> None:
    """Append `line` to the file at `path`: the order the jobs ran in."""
    with open(path, "a") as out:
        out.write(line + "\n")
