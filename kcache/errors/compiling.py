"""kcache's exceptions of a compile: a target, a kernel's compile and its worker, the toolchain."""

from __future__ import annotations

from kcache.errors.base import KCacheError


class TargetError(KCacheError, ValueError):
    """The compile target cannot be resolved (no GPU and no arch, say)."""

    def __init__(self, target: object, reason: str, fix: str) -> None:
        self.target = target
        self.reason = reason
        self.fix = fix
        self._init_args = (target, reason, fix)
        super().__init__(f"cannot resolve compile target {target!r}: {reason}. Fix: {fix}")


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
