"""What a Triton compile was asked for, read from the frame of Triton's `compile` (its `src` and
`options`): the config `kcache ls` shows and a crash's message names (`BLOCK=1024, num_warps=4, ...`),
and the key's parts `kcache why-miss` compares (the kernel's own source digest, its constexprs), which a
group's files tell only mixed: Triton's IR is made under the options, so a change of num_warps alone
changes it too (Gluon writes num_warps into it)."""

from __future__ import annotations

import logging
import sys
from types import FrameType
from typing import Any

log = logging.getLogger("kcache")


def constexprs(frame: FrameType) -> dict[str, Any]:
    """The compile's constexprs by name (a config's block sizes): Triton keeps them by argument index."""
    src = frame.f_locals.get("src")
    try:
        names, signature = src.fn.arg_names, src.signature
        return {names[path[0]]: value for path, value in sorted(src.constants.items())
                if len(path) == 1 and path[0] < len(names) and signature.get(names[path[0]]) == "constexpr"}
    except (AttributeError, TypeError, IndexError):
        return {}


def config_of(frame: FrameType) -> list[str]:
    """The config of the compile: its constexprs, then num_warps, num_stages, and num_ctas and maxnreg
    where not their defaults."""
    options = frame.f_locals.get("options")
    parts = [f"{name}={value}" for name, value in constexprs(frame).items()]
    for option, default in (("num_warps", ...), ("num_stages", ...), ("num_ctas", 1), ("maxnreg", None)):
        value = getattr(options, option, default)
        if value is not default and value != default:
            parts.append(f"{option}={value}")
    return parts


def kernel_source_digest(frame: FrameType) -> str | None:
    """The digest Triton keys the kernel's own source by (its JITFunction's cache_key: the source, its
    dependencies, its line), None for a compile of an IR file."""
    digest = getattr(getattr(frame.f_locals.get("src"), "fn", None), "cache_key", None)
    return digest if isinstance(digest, str) else None


def record_of(frame: FrameType) -> dict[str, Any]:
    """What kcache-triton.json keeps of the compile: its config (for `ls`), its kernel's source digest and
    constexprs (for `why-miss`). JSON-able: a constexpr that is not a plain value is kept as its repr."""
    record: dict[str, Any] = {"config": ", ".join(config_of(frame))}
    digest = kernel_source_digest(frame)
    if digest is not None:
        record["source"] = digest
    values = {name: value if isinstance(value, (bool, int, float, str)) or value is None else repr(value)
              for name, value in constexprs(frame).items()}
    if values:
        record["constexprs"] = values
    return record


def record_of_caller() -> dict[str, Any] | None:
    """What the Triton `compile` that called put_group was asked for (kcache.triton.compile_record), or
    None where another caller put the group."""
    frame = compile_frame(3)  # compile -> CacheManager.put_group -> here -> compile_frame
    try:
        return record_of(frame) if frame is not None else None
    except Exception as err:  # noqa: BLE001 - a label for ls and why-miss never fails Triton's compile
        log.debug("kcache: cannot record what Triton's compile of this group was asked for: %s", err)
        return None


def compile_frame(depth: int = 2) -> FrameType | None:
    """The frame of Triton's `compile` that called the manager's get_group (`depth` frames up from
    here; a deeper caller says how deep), or None."""
    compile_fn = getattr(sys.modules.get("triton.compiler.compiler"), "compile", None)
    frame = sys._getframe(depth)  # compile -> CacheManager.get_group -> here
    return frame if frame.f_code is getattr(compile_fn, "__code__", None) else None
