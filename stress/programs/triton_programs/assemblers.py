"""Triton's assemblers wrapped, to count compiles by the tool Triton runs rather than by any cache: the
environment that makes Triton run the wrappers, how many assemblies ran, and how many ran at once."""

from __future__ import annotations

from pathlib import Path

import triton

# Triton's assemblers: ptxas, and the ptxas-blackwell with which Triton 3.9 assembles sm_90 too.
ASSEMBLERS = {"TRITON_PTXAS_PATH": "ptxas", "TRITON_PTXAS_BLACKWELL_PATH": "ptxas-blackwell"}


def counting_assemblers(folder: Path, triton_dir: Path | None = None) -> dict[str, str]:
    """Wrappers in `folder` of the assemblers of Triton at `triton_dir` (default: this one's), each
    appending a line to `folder/runs` per assembly (not per `--version`); the environment that makes
    Triton run them. A compile counted by the tool Triton runs, not by any cache."""
    triton_dir = triton_dir or Path(triton.__file__).parent
    env = {}
    for variable, name in ASSEMBLERS.items():
        real = triton_dir / "backends" / "nvidia" / "bin" / name
        if real.exists():
            wrapper = folder / name
            wrapper.write_text(f"#!/bin/sh\ncase \"$*\" in *--version*) ;; *) echo $$ >> {folder / 'runs'} ;; esac\n"
                               f"exec {real} \"$@\"\n")
            wrapper.chmod(0o755)
            env[variable] = str(wrapper)
    return env


def timed_assemblers(folder: Path) -> dict[str, str]:
    """Like counting_assemblers, each wrapper also appending `+ NS` as an assembly starts and `- NS` as it
    ends (nanoseconds since the epoch) to `folder/spans`: how many ran at once (`most_at_once`)."""
    env = counting_assemblers(folder)
    for variable, wrapper in env.items():
        text = Path(wrapper).read_text()
        real = text.rsplit("exec ", 1)[1].split(" ", 1)[0]
        spans = folder / "spans"
        Path(wrapper).write_text(
            f"#!/bin/sh\ncase \"$*\" in *--version*) exec {real} \"$@\" ;; esac\necho $$ >> {folder / 'runs'}\n"
            f"echo \"+ $(date +%s%N)\" >> {spans}\n{real} \"$@\"\nstatus=$?\necho \"- $(date +%s%N)\" >> {spans}\n"
            "exit $status\n")
    return env


def most_at_once(folder: Path) -> int:
    """The most assemblies that ran at once, from `folder/spans` (timed_assemblers)."""
    spans = folder / "spans"
    events = sorted((int(stamp), 1 if sign == "+" else -1) for sign, stamp in
                    (line.split() for line in spans.read_text().splitlines() if line.strip())) if spans.exists() else []
    running = most = 0
    for _stamp, step in events:
        running += step
        most = max(most, running)
    return most


def assembler_runs(folder: Path) -> int:
    runs = folder / "runs"
    return len(runs.read_text().splitlines()) if runs.exists() else 0
