"""kcache's compile faults as Triton's autotuner understands them.

`@triton.autotune` skips a config whose benchmark raises `OutOfResources`, `CompileTimeAssertionFailure`
or `PTXASError`, and lets any other exception end the tune. A compile that crashed or hung in its worker
is the config's fault as much as a failed ptxas run is, so these are `PTXASError`s too; and they are
kcache's `CompilerCrashed` and `CompileTimeout`, for every other caller.
"""

from __future__ import annotations

from triton.runtime.errors import PTXASError

from kcache.errors import CompilerCrashed, CompileTimeout


class TritonCompilerCrashed(CompilerCrashed, PTXASError):
    """The process that ran a Triton compile's back half died (an abort, a segfault, a kill); this process
    lives. `remembered`: the crash is an earlier process's, read from the cache, and nothing was compiled
    now."""

    def __init__(self, kernel_name: str, signal_name: str | None, exit_code: int | None, stderr_tail: str,
                 remembered: str | None = None) -> None:
        CompilerCrashed.__init__(self, kernel_name, signal_name, exit_code, stderr_tail)
        self._init_args = (kernel_name, signal_name, exit_code, stderr_tail, remembered)
        self.remembered = remembered
        # Where its passes and ptxas ran: a worker of the compile service, or a fork of this process at a
        # cold start (kcache.triton.isolation); never this process.
        how = f"was killed by {signal_name}" if signal_name else f"exited with status {exit_code}"
        tail = stderr_tail.strip() or "(it printed nothing)"
        self.error_message = (f"Triton's compile of {kernel_name!r} crashed: the process that ran its passes and "
                              f"ptxas (a compile worker, or a fork of this one) {how}; this process is unaffected, and "
                              f"@triton.autotune skips this config. Its last output:\n{tail}")
        if remembered:
            self.error_message = (f"{self.error_message}\n(remembered: this compile crashed on {remembered}, and "
                                  "is not run again until Triton or its toolchain changes; `kcache clear --crashes` "
                                  "forgets it, and the next call compiles it again)")
        self.args = (self.error_message,)

    def __str__(self) -> str:
        return self.error_message


class TritonCompileTimeout(CompileTimeout, PTXASError):
    """A Triton compile's back half outlived KCACHE_COMPILE_TIMEOUT; its worker was killed."""

    def __init__(self, kernel_name: str, timeout: float) -> None:
        CompileTimeout.__init__(self, kernel_name, timeout)
        self.error_message = str(self.args[0])

    def __str__(self) -> str:
        return self.error_message
