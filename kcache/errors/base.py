"""The root of kcache's exceptions, and what its OSErrors share."""

from __future__ import annotations


class KCacheError(Exception):
    """Base class of every error kcache raises on purpose.

    Errors cross the compile pool's process boundary by pickle, which
    rebuilds an exception from `self.args`; the subclasses keep their
    constructor arguments there (`_init_args`) so that they rebuild exactly.
    """

    _init_args: tuple[object, ...] = ()

    def __reduce__(self) -> tuple[type[KCacheError], tuple[object, ...]]:
        return (type(self), self._init_args or self.args)


class _Explained:
    """For kcache's OSErrors: the message is the whole explanation (OSError's own str() would print
    only "[Errno N] message")."""

    strerror: str | None

    def __str__(self) -> str:
        return self.strerror or super().__str__()


class SettingError(KCacheError, ValueError):
    """A KCACHE_* variable whose value kcache cannot use: one line naming the variable, the value and
    the forms it takes (kcache.setting_values.check_settings). Raised before anything runs: by the CLI,
    `kcache run` (exit status 2, before the program), `kcache.install()` and every cache's open."""

    def __init__(self, setting: str, message: str) -> None:
        self.setting = setting
        self._init_args = (setting, message)
        super().__init__(message)
