"""Secrets never printed: a URL's credentials (`redis://user:password@host`) shown as `redis://user:***@host`.

`masked` is the one helper every place that shows a URL uses (`kcache config`, `kcache doctor`, the
remote tiers' names in their warnings, a bad KCACHE_REMOTE's message), and `mask_log_records` puts it
on kcache's logger, so that no line of kcache's log carries a password whatever it quotes (an error of
redis-py's naming the URL, say). The base layer: anything may use it.
"""

from __future__ import annotations

import re
from typing import Any

# scheme://[user]:password@ -> scheme://[user]:***@ ; scheme://token@ (no colon: a password alone, as
# redis://:pw@ is written by some) -> scheme://***@. The user name is kept: it says which account.
_CREDENTIALS = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.-]*://)(?P<userinfo>[^/@\s'\"]*)@")
MASK = "***"


def _mask(match: re.Match[str]) -> str:
    user, colon, _password = match.group("userinfo").partition(":")
    if not colon:
        return f"{match.group('scheme')}{MASK}@" if user else match.group(0)
    return f"{match.group('scheme')}{user}:{MASK}@"


def masked(text: str) -> str:
    """`text` with the password of every URL in it replaced by ***."""
    return _CREDENTIALS.sub(_mask, text) if "@" in text else text


_FILTER: list[Any] = []  # the one filter, made at the first call


def mask_log_records(logger: Any = None) -> None:
    """Mask every record of kcache's logger (idempotent): each record's message, once formatted, with
    `masked`. A filter runs only for records that pass the level check: a line not emitted costs nothing.
    `logging` is imported here, not at the top: kcache sets this up when `logging` is imported (kcache's
    __init__), and this module must not import it in turn."""
    import logging

    if not _FILTER:
        class MaskingFilter(logging.Filter):
            def filter(self, record: logging.LogRecord) -> bool:
                message = record.getMessage()
                shown = masked(message)
                if shown != message:  # a record with nothing to mask is left as it is
                    record.msg, record.args = shown, None
                return True

        _FILTER.append(MaskingFilter())
    target = logger or logging.getLogger("kcache")
    if _FILTER[0] not in target.filters:
        target.addFilter(_FILTER[0])
