"""One `get_or_compile` call's normalized arguments and key, and what the pipeline needs of them."""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kcache.keys import JIT_CALL_FIELD, derive_key

# The @tilelang.jit call being served ({"name", "args"}), set by the drop-in around its lookup
# (kcache.dropin.routing): what `kcache ls` names the entry by, as the user wrote it.
JIT_CALL: ContextVar[dict[str, str] | None] = ContextVar("kcache_jit_call", default=None)


@dataclass
class KernelRequest:
    """A kernel request after normalization: what the key is derived from, and the key."""

    func: Any
    resolved: Any
    out_idx: list[int] | None
    pass_configs: dict[str, Any]
    compile_flags: list[str] | None
    toolchain: dict[str, object]
    context: Any = None  # the caller's compile context (kcache.tilelang.context), taken at the call
    key: str = ""
    fields: dict[str, object] | None = None  # what `key` is derived from
    _described: dict[str, object] | None = None
    jit_call: dict[str, str] | None = None  # JIT_CALL at the lookup: never part of the key

    @classmethod
    def build(cls, backend: Any, func: Any, target: Any, out_idx: Any, pass_configs: Any, compile_flags: Any,
              execution_backend: str, target_key: str | None, toolchain: dict[str, object]) -> KernelRequest:
        request = cls(
            func=func,
            resolved=backend.resolve_target(target, execution_backend, target_key),
            out_idx=backend.normalize_out_idx(out_idx),
            pass_configs=backend.normalize_pass_configs(pass_configs),
            compile_flags=backend.normalize_flags(compile_flags),
            toolchain=toolchain,
            context=backend.capture_context(),
            jit_call=JIT_CALL.get(),
        )
        request.fields = backend.key_fields(
            func, request.resolved, request.out_idx, request.pass_configs, request.compile_flags, request.toolchain,
            request.context,
        )
        request.key = derive_key(request.fields)
        return request

    def described(self, backend: Any) -> dict[str, object]:
        """The key's fields as meta.json and the miss log keep them (a digest of the source): made
        on first use, which is a miss or a recording, never a plain hit."""
        if self._described is None:
            self._described = backend.describe_key_fields(self.fields or {})
        return self._described

    def entry_fields(self, backend: Any) -> dict[str, object]:
        """`described`, with the @tilelang.jit call (JIT_CALL_FIELD) for the entry's meta.json."""
        described = self.described(backend)
        return described if self.jit_call is None else {**described, JIT_CALL_FIELD: self.jit_call}

    def loader(self, backend: Any) -> Any:
        """The disk tier's loader for this request: the backend's load_kernel with these arguments."""

        def load(entry_dir: Path, files: dict[str, bytes], noexec_mount: Path | None) -> Any:
            return backend.load_kernel(self.func, entry_dir, files, self.resolved, self.out_idx, self.pass_configs,
                                       self.compile_flags, noexec_mount=noexec_mount)

        return load
