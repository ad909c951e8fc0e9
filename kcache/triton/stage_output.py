"""What the back half of a Triton compile prints, carried back to the caller, which prints it as Triton would.

Triton's stages print where a user asked them to: `TRITON_DUMP_PTXAS_LOG=1` prints ptxas's report
(registers, spills) and `NVPTX_ENABLE_DUMP=1` the PTX, on stdout; MLIR's and LLVM's dumps
(`MLIR_ENABLE_DUMP`, `LLVM_IR_ENABLE_DUMP`) and Python's warnings go to stderr. In a compile worker
those land in the worker's own files. Here, around the stages:
- stdout (descriptor 1) goes to a private unlinked file of the worker's, read back once the stages end,
  then put back;
- stderr (descriptor 2) is left where it is, the worker's stderr file: a compiler's crash report must
  stay there for the crash's message (kcache.triton.isolation.compiler_said). What the stages added to
  it is read back from the offset it had before them.
Each is bounded (RELAYED_BYTES_MAX); a longer output is cut, and says so.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field

RELAYED_BYTES_MAX = 16 << 20  # per stream and compile: MLIR's dump of a large kernel is some MB


@dataclass
class StageOutput:
    """What a compile's stages printed: filled as `captured` ends."""

    stdout: str = ""
    stderr: str = ""
    cut: list[str] = field(default_factory=list)  # the streams that were longer than RELAYED_BYTES_MAX


@contextlib.contextmanager
def captured() -> Iterator[StageOutput]:
    """Within it, what this process writes to descriptors 1 and 2 is kept in the StageOutput it yields:
    stdout only there, stderr in its file as well. A stderr that is no regular file (a terminal, a
    pipe) is left alone and not kept."""
    output = StageOutput()
    _flush()
    stderr_start = _offset_of(2)
    with tempfile.TemporaryFile(prefix="kcache-triton-stdout-") as stdout_file:  # unlinked, the worker's own
        saved_stdout = os.dup(1)
        os.dup2(stdout_file.fileno(), 1)
        try:
            yield output
        finally:
            _flush()
            os.dup2(saved_stdout, 1)
            os.close(saved_stdout)
            output.stdout = _read_from(stdout_file.fileno(), 0, "stdout", output)
            if stderr_start is not None:
                output.stderr = _read_from(2, stderr_start, "stderr", output)


def relay(output: StageOutput, stderr_too: bool = True) -> None:
    """Print `output` here, each stream on its own, as Triton's stages would have in this process
    (`stderr_too=False`: its stdout alone, where the stderr was relayed whole already)."""
    for text, stream in ((output.stdout, sys.stdout), (output.stderr if stderr_too else "", sys.stderr)):
        if text:
            stream.write(text)
            stream.flush()
    for name in output.cut:
        sys.stderr.write(f"kcache: the compile's {name} was longer than {RELAYED_BYTES_MAX >> 20} MiB; "
                         "the rest is not shown\n")


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # a stream the program replaced may not flush
            stream.flush()


def _offset_of(fd: int) -> int | None:
    """The end of the regular file at `fd`, or None where it is none."""
    try:
        return os.lseek(fd, 0, os.SEEK_END)
    except OSError:  # a terminal or a pipe: nothing to read back
        return None


def _read_from(fd: int, start: int, name: str, output: StageOutput) -> str:
    """At most RELAYED_BYTES_MAX bytes of `fd` from `start`, as text; `name` noted in `output.cut` if more."""
    try:
        data = os.pread(fd, max(0, min(RELAYED_BYTES_MAX + 1, os.fstat(fd).st_size - start)), start)
    except OSError:  # opened write-only: nothing to read back
        return ""
    if len(data) > RELAYED_BYTES_MAX:
        output.cut.append(name)
        data = data[:RELAYED_BYTES_MAX]
    return data.decode("utf-8", errors="replace")
