"""`python -m kcache`: the cache's command line (kcache.cli.launch, kcache.cli.main)."""

import os
import sys


def _forget_the_working_directory() -> None:
    """`python -m` puts the working directory first on sys.path. The command imports nothing from there:
    the entry is dropped, so that neither its later imports (TileLang, Triton, their dependencies) nor
    `kcache run`'s program find a module of the directory's in place of the installed one. Where `kcache`
    itself came from there as a namespace package (a folder named kcache, such as the clone seen from its
    parent directory, shadowing an editable install), it is forgotten and imported again from the install."""
    if getattr(sys.flags, "safe_path", False) or not sys.path or sys.path[0] not in ("", os.getcwd()):
        return  # -P or PYTHONSAFEPATH: nothing was added
    del sys.path[0]
    package = sys.modules.get("kcache")
    if package is not None and getattr(package, "__file__", None) is None:
        for name in [name for name in sys.modules if name == "kcache" or name.startswith("kcache.")]:
            del sys.modules[name]


_forget_the_working_directory()

from kcache.cli.launch import main  # noqa: E402 - after the working directory is off the path

sys.exit(main())
