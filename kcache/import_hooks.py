"""One-shot import hooks: run something right before a module's import starts, or right after its
code has run, without importing it first.

kcache uses them where what it must do depends on a module the program imports later: watch TileLang's
callback registrations once `tvm_ffi` is loaded (`import kcache` may come first), open the default
cache when TileLang's import begins. A hook is a `sys.meta_path` entry that answers nothing itself:
it removes itself on its module's lookup and lets the real finders find the module.

Kept free of imports (not even `importlib.abc`, ~0.6 ms): `import kcache` loads it on the hit path.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any


def after_import(name: str, action: Callable[[], None]) -> None:
    """Call `action` once module `name` has run: now, if it has, else right after its import's code.
    An exception from `action` is raised where it runs: from this call, or from the program's import
    (an action that must not fail an import catches its own)."""
    if name in sys.modules:
        action()
    else:
        sys.meta_path.insert(0, _Hook(name, after=action))


def before_import(name: str, action: Callable[[], None]) -> None:
    """Call `action` when module `name`'s import begins, unless it is loaded already (then never).
    An exception from `action` is raised from the program's import, as in `after_import`."""
    if name not in sys.modules:
        sys.meta_path.insert(0, _Hook(name, before=action))


class _Hook:
    """A meta path finder for one module name, used once."""

    def __init__(self, name: str, *, before: Callable[[], None] | None = None,
                 after: Callable[[], None] | None = None) -> None:
        self.name, self.before, self.after = name, before, after

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != self.name:
            return None
        try:
            sys.meta_path.remove(self)  # one shot; and the real finders must answer the lookup below
        except ValueError:  # another thread's lookup took it first
            return None
        if self.before is not None:
            self.before()
        if self.after is None:
            return None  # the real finders, next on the path, find it
        import importlib.util

        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        run_module, after = spec.loader.exec_module, self.after

        def run_then_act(module: Any) -> None:
            run_module(module)
            after()

        spec.loader.exec_module = run_then_act  # type: ignore[method-assign]
        return spec
