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


def shadow_cuda_home(home: Path, nvcc_script: str) -> Path:
    """A CUDA home at `home` that is the real one (symlinks) but for `bin/nvcc`, which is
    `nvcc_script` with `{real}` standing for the real nvcc: how a test or a bench watches, counts or
    stalls nvcc in every process that compiles, TileLang finding it through CUDA_HOME."""
    real = real_cuda_home()
    (home / "bin").mkdir(parents=True, exist_ok=True)
    for item in real.iterdir():
        if item.name != "bin" and not (home / item.name).exists():
            (home / item.name).symlink_to(item)
    for tool in (real / "bin").iterdir():
        if tool.name != "nvcc" and not (home / "bin" / tool.name).exists():
            (home / "bin" / tool.name).symlink_to(tool)
    wrapper = home / "bin" / "nvcc"
    wrapper.write_text(nvcc_script.replace("{real}", str(real / "bin" / "nvcc")))
    wrapper.chmod(0o755)
    return home


class NvccCounter:
    def __init__(self, workdir: Path) -> None:
        self.log = workdir / "nvcc-calls.log"
        self.home = shadow_cuda_home(workdir / "cuda-home", _WRAPPER.replace("{log}", str(self.log)))
        self.log.touch()

    def env(self) -> dict[str, str]:
        return {"CUDA_HOME": str(self.home), "CUDA_PATH": str(self.home)}

    def count(self) -> int:
        return sum(1 for line in self.log.read_text().splitlines() if line.strip())
