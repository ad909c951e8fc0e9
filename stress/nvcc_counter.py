"""Count real nvcc compiles independently of kcache: a CUDA home whose nvcc logs, then execs the real one.

TileLang finds nvcc through CUDA_HOME (read at import), so a child process
started with `env(...)` compiles through the wrapper. Only device compiles
(`--cubin`/`--fatbin`/`-o`) are logged: `nvcc --version` is not a compile.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

_WRAPPER = """#!/bin/sh
case " $* " in
  *" --version "*) ;;
  *) echo "$$ $*" >> "{log}" ;;
esac
exec "{real}" "$@"
"""


def real_cuda_home() -> Path:
    nvcc = shutil.which("nvcc")
    if os.environ.get("CUDA_HOME"):
        return Path(os.environ["CUDA_HOME"]).resolve()
    for candidate in (Path("/usr/local/cuda"), Path(nvcc).resolve().parent.parent if nvcc else None):
        if candidate and (candidate / "bin" / "nvcc").exists() and (candidate / "include").exists():
            return candidate.resolve()
    raise FileNotFoundError("no CUDA toolkit found: set CUDA_HOME or put nvcc on PATH")


class NvccCounter:
    def __init__(self, workdir: Path) -> None:
        real = real_cuda_home()
        self.home = workdir / "cuda-home"
        self.log = workdir / "nvcc-calls.log"
        (self.home / "bin").mkdir(parents=True, exist_ok=True)
        for item in real.iterdir():
            if item.name != "bin" and not (self.home / item.name).exists():
                (self.home / item.name).symlink_to(item)
        for tool in (real / "bin").iterdir():
            if tool.name != "nvcc" and not (self.home / "bin" / tool.name).exists():
                (self.home / "bin" / tool.name).symlink_to(tool)
        wrapper = self.home / "bin" / "nvcc"
        wrapper.write_text(_WRAPPER.format(log=self.log, real=real / "bin" / "nvcc"))
        wrapper.chmod(0o755)
        self.log.touch()

    def env(self) -> dict[str, str]:
        return {"CUDA_HOME": str(self.home), "CUDA_PATH": str(self.home)}

    def count(self) -> int:
        return sum(1 for line in self.log.read_text().splitlines() if line.strip())
