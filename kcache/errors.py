"""kcache's exceptions.

Every error subclasses a builtin as well as `KCacheError`, so callers that
already catch `OSError`, `TimeoutError` or `ValueError` keep working, and
each carries the path or kernel it is about plus a hint of what to do.
"""

from __future__ import annotations

import errno as _errno
import os


class KCacheError(Exception):
    """Base class of every error kcache raises on purpose.

    Errors cross the compile pool's process boundary by pickle, which
    rebuilds an exception from `self.args`; the subclasses keep their
    constructor arguments there (`_init_args`) so that they rebuild exactly.
    """

    _init_args: tuple[object, ...] = ()

    def __reduce__(self) -> tuple[type[KCacheError], tuple[object, ...]]:
        return (type(self), self._init_args or self.args)


class TargetError(KCacheError, ValueError):
    """The compile target cannot be resolved (no GPU and no arch, say)."""

    def __init__(self, target: object, reason: str, fix: str) -> None:
        self.target = target
        self.reason = reason
        self.fix = fix
        self._init_args = (target, reason, fix)
        super().__init__(f"cannot resolve compile target {target!r}: {reason}. Fix: {fix}")


class SettingError(KCacheError, ValueError):
    """A KCACHE_* variable whose value kcache cannot use: one line naming the variable, the value and
    the forms it takes (kcache.setting_values.check_settings). Raised before anything runs: by the CLI,
    `kcache run` (exit status 2, before the program), `kcache.install()` and every cache's open."""

    def __init__(self, setting: str, message: str) -> None:
        self.setting = setting
        self._init_args = (setting, message)
        super().__init__(message)


class ArchMismatch(KCacheError, RuntimeError):
    """A kernel built for one CUDA arch was called on a device of another compute capability."""

    def __init__(self, kernel_name: str, arch: str, device: str, capability: tuple[int, int]) -> None:
        self.kernel_name = kernel_name
        self.arch = arch
        self.device = device
        self.capability = tuple(capability)
        self._init_args = (kernel_name, arch, device, capability)
        major, minor = capability
        super().__init__(
            f"kernel {kernel_name!r} was built for {arch}, and {device} is compute capability {major}.{minor} "
            f"(sm_{major}{minor}): a kernel runs only on the compute capability its target names, exactly. Fix: "
            f"compile for this device (target \"auto\", or {{\"kind\": \"cuda\", \"arch\": \"sm_{major}{minor}\"}}), or "
            "call it on a device of its arch. To build kernels for another GPU, compile where no GPU is visible "
            "(CUDA_VISIBLE_DEVICES=)")


class CompileError(KCacheError, RuntimeError):
    """TileLang or nvcc rejected a kernel.

    The message starts with the kernel's name and the compiler's first errors (`summary`), then
    TileLang's own message, bounded (`bounded_compiler_message`: for an nvcc failure or timeout,
    nvcc's output and its `Command:` line, without the CUDA source before them, which ran to
    20,000 characters), and ends with kcache's log, which has the whole traceback, source included
    (`log_path`). `compiler_message` keeps TileLang's message whole.
    """

    def __init__(self, kernel_name: str, summary: str, log_path: str | None, compiler_message: str = "") -> None:
        self.kernel_name = kernel_name
        self.summary = summary
        self.log_path = log_path
        self.compiler_message = compiler_message
        self._init_args = (kernel_name, summary, log_path, compiler_message)
        where = f"full log: {log_path}" if log_path else "no log could be written: CompileError.compiler_message is whole"
        told = bounded_compiler_message(compiler_message)
        whole = f"\nTileLang's message:\n{told}\n" if told else ""
        super().__init__(f"compiling kernel {kernel_name!r} failed:\n{summary}\n{whole}({where})")


# TileLang's message in a CompileError: at most this many characters of nvcc's output, and of its
# Command: line (a long list of include paths); the log has them whole.
COMPILER_OUTPUT_CHARS = 3000
COMMAND_LINE_CHARS = 1500


def bounded_compiler_message(message: str) -> str:
    """TileLang's message as a CompileError tells it: for nvcc's failures ("<source> Compilation
    error: <nvcc output> Command: <command line>"), the output and the command without the source;
    any other message, its head and tail around a cut. Every cut says so."""
    message = message.strip()
    source, marker, after = message.partition("Compilation error:")
    if not marker:
        return _clipped(message, COMPILER_OUTPUT_CHARS + COMMAND_LINE_CHARS)
    output, command_marker, command = after.partition("\nCommand:")
    told = f"(the CUDA source before it, {len(source.strip())} characters, is in the log)\n{marker}\n" \
        f"{_clipped(output.strip(), COMPILER_OUTPUT_CHARS)}"
    return told + (f"\nCommand: {_clipped(command.strip(), COMMAND_LINE_CHARS)}" if command_marker else "")


def _clipped(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    head, tail = text[:limit // 3], text[-(limit - limit // 3):]
    return f"{head}\n... ({len(text) - len(head) - len(tail)} characters cut: the log has them) ...\n{tail}"


class CacheLockTimeout(KCacheError, TimeoutError):
    """Waiting for another process's compile of the same kernel took too long."""

    def __init__(self, lock_file: str, timeout: float, key: str) -> None:
        self.lock_file = lock_file
        self.timeout = timeout
        self.key = key
        self._init_args = (lock_file, timeout, key)
        super().__init__(
            f"timed out after {timeout:g} s waiting for the compile lock {lock_file} (key {key[:16]}). "
            "Another process holds it and is still compiling, or is stuck. "
            "Raise KCACHE_LOCK_TIMEOUT for very long compiles, or find the holder with `fuser -v` on the lock file."
        )


class _Explained:
    """For kcache's OSErrors: the message is the whole explanation (OSError's own str() would print
    only "[Errno N] message")."""

    strerror: str | None

    def __str__(self) -> str:
        return self.strerror or super().__str__()


class PublishError(_Explained, KCacheError, OSError):
    """Publishing an entry failed for a reason other than losing a race.

    Subclasses OSError with the original errno, so `err.errno` works as usual.
    """

    def __init__(self, path: str, err: OSError, action: str) -> None:
        code = err.errno if err.errno is not None else _errno.EIO
        self.path = path
        self.action = action
        self.cause = err
        self._init_args = (path, err, action)
        name = _errno.errorcode.get(code, str(code))
        super().__init__(code, f"{action} {path} failed with {name} ({os.strerror(code)}): {err}. {_hint(code)}")


class CorruptEntry(KCacheError, ValueError):
    """A published entry does not match its manifest or cannot be loaded."""

    def __init__(self, path: str, reason: str) -> None:
        self.path = path
        self.reason = reason
        self._init_args = (path, reason)
        super().__init__(f"cache entry {path} is corrupt: {reason}")


class CompilerCrashed(KCacheError, RuntimeError):
    """The compile worker died (a C++ abort, a segfault, an exit) while compiling.

    Only that worker died; the pool replaced it. `stderr_tail` holds the
    worker's last lines of output, where the compiler says why.
    """

    def __init__(self, kernel_name: str, signal_name: str | None, exit_code: int | None, stderr_tail: str) -> None:
        self.kernel_name = kernel_name
        self.signal_name = signal_name
        self.exit_code = exit_code
        self.stderr_tail = stderr_tail
        self._init_args = (kernel_name, signal_name, exit_code, stderr_tail)
        how = f"was killed by {signal_name}" if signal_name else f"exited with status {exit_code}"
        tail = stderr_tail.strip() or "(it printed nothing)"
        super().__init__(
            f"the compile worker {how} while compiling {kernel_name!r}; this process is unaffected. "
            f"The worker's last output:\n{tail}"
        )


class CompileAborted(KCacheError, RuntimeError):
    """A compile was stopped before it finished, its worker killed (by the compile service, when the
    process that asked for it went away)."""

    def __init__(self, kernel_name: str, why: str) -> None:
        self.kernel_name = kernel_name
        self.why = why
        self._init_args = (kernel_name, why)
        super().__init__(f"the compile of {kernel_name!r} was stopped: {why}")


class CompileTimeout(KCacheError, TimeoutError):
    """A compile outlived its time limit; its worker (and the worker's compiler processes) were killed."""

    def __init__(self, kernel_name: str, timeout: float) -> None:
        self.kernel_name = kernel_name
        self.timeout = timeout
        self._init_args = (kernel_name, timeout)
        super().__init__(
            f"compiling {kernel_name!r} took longer than {timeout:g} s, so its worker was killed. "
            "Raise KCACHE_COMPILE_TIMEOUT (0 means no limit) if this kernel really compiles that slowly."
        )


class CompilePoolError(KCacheError, RuntimeError):
    """A compile worker could not be started (a broken environment, not a kernel's fault)."""

    def __init__(self, reason: str, stderr_tail: str) -> None:
        self.reason = reason
        self.stderr_tail = stderr_tail
        self._init_args = (reason, stderr_tail)
        super().__init__(
            f"could not start a kcache compile worker: {reason}. Its output:\n{stderr_tail.strip() or '(none)'}\n"
            "Check that this Python can import TileLang on its own, or set KCACHE_COMPILE_ISOLATION=inprocess."
        )


class WorkerStartFailed(CompilePoolError):
    """A compile worker (or the worker template) did not get ready within its deadline, or died
    starting; `output` holds what it printed."""

    def __init__(self, reason: str, output: str) -> None:
        super().__init__(reason, output)
        self.output = output


class UnwritableCache(_Explained, KCacheError, PermissionError):
    """The cache root cannot be written by this process, and KCACHE_ON_UNWRITABLE=error."""

    def __init__(self, root: str, reason: str, fix: str | None = None) -> None:
        self.root = root
        self.reason = reason
        self._init_args = (root, reason, fix)
        # The fix fits the cause (kcache.store.access.unwritable_fix): no group helps a read-only mount.
        fix = fix or ("share it through a group (KCACHE_UMASK=002 and a setgid root, see docs/operations.md), give "
                      "it to this user, or point KCACHE_DIR elsewhere")
        super().__init__(
            _errno.EACCES,
            f"the kcache root {root} is not writable by this process: {reason}. Fix: {fix}; "
            "KCACHE_ON_UNWRITABLE=fallback reads it and writes a per-user root instead",
        )


class NoExecError(_Explained, KCacheError, OSError):
    """A kernel library cannot be mapped where it is (noexec), nor from any copy kcache may make."""

    def __init__(self, library: str, mount: str | None, refusals: str) -> None:
        self.library = library
        self.mount = mount
        self.refusals = refusals
        self._init_args = (library, mount, refusals)
        where = f"{mount} is mounted noexec" if mount else "this machine refuses to map its code"
        super().__init__(
            _errno.EPERM,
            f"cannot load {library}: {where}, and no copy could be loaded either ({refusals}). The entry is "
            "intact and was left alone. Fix: point KCACHE_DIR at a filesystem mounted with exec, or set "
            "KCACHE_EXEC_DIR to a directory on one",
        )


class LocalLoadError(_Explained, KCacheError, OSError):
    """A verified entry cannot be loaded for a reason of this machine's (a library it links is missing)."""

    def __init__(self, library: str, cause: str) -> None:
        self.library = library
        self.cause = cause
        self._init_args = (library, cause)
        super().__init__(
            _errno.ENOENT,
            f"cannot load {library}: {cause}. The entry is intact and was left alone: this machine lacks "
            "something it links (the CUDA driver's libcuda, say). Fix the environment (LD_LIBRARY_PATH, the driver)",
        )


class TileLangMissing(KCacheError, ModuleNotFoundError):
    """TileLang is not installed in this Python environment, and what was asked needs it (a compile, a
    load, the drop-in, a bundle's toolchain check). A ModuleNotFoundError, as the bare import's."""

    def __init__(self, alternative: str = "") -> None:
        self.alternative = alternative
        self._init_args = (alternative,)
        otherwise = f" ({alternative})" if alternative else ""
        super().__init__(f"TileLang is not installed: pip install tilelang{otherwise}", name="tilelang")


class TileLangUnsupported(KCacheError, RuntimeError):
    """The installed TileLang is outside the versions kcache supports, or lacks an internal kcache
    needs (kcache/tilelang/support.py): the message names the version, the supported range and the fix."""

    def __init__(self, message: str) -> None:
        self._init_args = (message,)
        super().__init__(message)


class UntrustedEntry(_Explained, KCacheError, PermissionError):
    """An entry (or a directory above it up to the root) that someone else could have written: it is
    never loaded, never unpickled and never quarantined (it is not the entry's fault)."""

    def __init__(self, path: str, reason: str) -> None:
        self.path = path
        self.reason = reason
        self._init_args = (path, reason)
        super().__init__(
            _errno.EACCES,
            f"not loading {path}: {reason}. Fix the ownership or mode (chmod go-w), share the root through a "
            "group (KCACHE_UMASK, docs/operations.md), or point KCACHE_DIR at a root of your own",
        )


def _hint(code: int) -> str:
    hints = {
        _errno.ENOSPC: "The cache filesystem is full: free space or point KCACHE_DIR elsewhere.",
        _errno.EDQUOT: "The disk quota is exhausted: free space or point KCACHE_DIR elsewhere.",
        _errno.EROFS: "The cache filesystem is read-only: point KCACHE_DIR at a writable directory.",
        _errno.EACCES: "No permission: check the owner and mode of the cache root, or point KCACHE_DIR elsewhere.",
        _errno.EPERM: "No permission: check the owner and mode of the cache root, or point KCACHE_DIR elsewhere.",
        _errno.EXDEV: "Staging and entries are on different filesystems: do not mount over parts of the cache root.",
    }
    return hints.get(code, "Check the cache filesystem's health.")
