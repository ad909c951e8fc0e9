"""`kcache export`: a root's verified kernel entries written to one signed bundle file.

The bundle holds the root's kernels (code), so it is no more readable than the root: 0600, or 0640
in the root's group when the root is shared by a group (group mode, docs/operations.md, and a root
its group may read). It is written to a temporary file beside it (fsutil.create_temporary_at:
O_EXCL, O_NOFOLLOW, created 0600 before any byte is written) and renamed into place; interrupted
before the rename, the temporary file is removed and the bundle's path is as it was.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import io
import json
import logging
import os
import stat
import tarfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kcache.bundle.entries import BundleError, arch_allowed
from kcache.bundle.manifest import (
    BUNDLE_FORMAT,
    FROM_ENVIRONMENT,
    MANIFEST_MEMBER,
    SIGNATURE_MEMBER,
    arch_of,
    bundle_secret,
    sign,
)
from kcache.bundle.sections import SECTIONS, Section
from kcache.errors import CorruptEntry
from kcache.interruption import Interrupted, signals_deferred
from kcache.setting_values import default_root
from kcache.store import sharing
from kcache.store.components import COMPONENTS, KERNELS, META
from kcache.store.entries import EntryStore
from kcache.store.fsutil import create_temporary_at

log = logging.getLogger("kcache")

PRIVATE_BUNDLE_MODE = 0o600
GROUP_BUNDLE_MODE = 0o640


@dataclass
class ExportReport:
    bundle: str
    entries: int = 0
    bytes: int = 0
    archs: list[str] = field(default_factory=list)
    signed: bool = False
    triton: int = 0  # of `entries`, Triton's (kcache.triton)
    helion: int = 0  # of `entries`, Helion's picks (kcache.helion)
    missing: list[str] = field(default_factory=list)  # asked-for keys this root does not hold
    skipped: list[str] = field(default_factory=list)  # entries that failed verification here


def export_bundle(bundle: str | os.PathLike[str], *, root: str | os.PathLike[str] | None = None,
                  keys: Iterable[str] | None = None, archs: Iterable[str] | None = None, since: float | None = None,
                  secret: str | None = FROM_ENVIRONMENT) -> ExportReport:
    """Write the verified kernel entries of `root` (default: the default root; all of them, or those of
    `keys`, of `archs`, created at or after `since`, a time.time()) to the bundle file `bundle`,
    atomically (a temporary file beside it, renamed), signed with `secret` (default:
    KCACHE_BUNDLE_SECRET; None or empty: unsigned). The file is as private as the root
    (`bundle_group_access`)."""
    bundle = Path(bundle)
    secret = bundle_secret(secret)
    root_path = Path(root) if root is not None else default_root()
    store = EntryStore(root_path, KERNELS, COMPONENTS, bind_key=True)
    wanted = set(keys) if keys is not None else None
    allowed_archs = set(archs) if archs is not None else None
    report = ExportReport(str(bundle), signed=bool(secret))
    present = set(store.keys())
    if wanted is not None:
        report.missing = sorted(wanted - present - {key for section in SECTIONS
                                                    for key in section.store_of(root_path).keys()})
    chosen: dict[str, dict[str, bytes]] = {}
    listing: dict[str, Any] = {}
    toolchains: list[Any] = []
    for key in sorted(present if wanted is None else wanted & present):
        try:
            files = store.read_with_manifest(key)
            if files is None:
                continue
        except (CorruptEntry, OSError) as err:
            report.skipped.append(key)
            log.warning("kcache: not exporting %s: %s", key[:16], getattr(err, "reason", err))
            continue
        meta = json.loads(files[META])
        if allowed_archs is not None and arch_of(meta) not in allowed_archs:
            continue
        if since is not None and not float(meta.get("created", 0)) >= since:
            continue
        chosen[key] = files
        if meta.get("toolchain") not in toolchains:
            toolchains.append(meta.get("toolchain"))
        listing[key] = {"kernel": meta.get("kernel"), "arch": arch_of(meta),
                        "files": {name: [len(data), hashlib.sha256(data).hexdigest()]
                                  for name, data in sorted(files.items())}}
    sections = {section.folder: _section_entries(section, root_path, wanted, allowed_archs, since, report)
                for section in SECTIONS}
    for folder, (section_chosen, _listing) in sections.items():
        setattr(report, folder, len(section_chosen))  # ExportReport.triton, .helion
    report.entries = len(chosen) + sum(len(section_chosen) for section_chosen, _listing in sections.values())
    report.archs = sorted({entry["arch"] for entry in listing.values()}
                          | {entry["arch"] for _chosen, section_listing in sections.values()
                             for entry in section_listing.values()})
    manifest_bytes = json.dumps({"format": BUNDLE_FORMAT, "created": time.time(), "toolchains": toolchains,
                                 "archs": report.archs, "entries": listing,
                                 **{folder: section_listing for folder, (_chosen, section_listing) in sections.items()}},
                                indent=1, sort_keys=True).encode()

    def write(tar: tarfile.TarFile) -> None:
        _add(tar, MANIFEST_MEMBER, manifest_bytes)
        if secret:
            _add(tar, SIGNATURE_MEMBER, sign(secret, manifest_bytes))
        for folder, entries in ((KERNELS, chosen), *((folder, section_chosen)
                                                     for folder, (section_chosen, _listing) in sections.items())):
            for key, files in entries.items():
                for name, data in sorted(files.items()):
                    _add(tar, f"{folder}/{key}/{name}", data)
                    report.bytes += len(data)

    _write_bundle_file(bundle, bundle_group_access(root_path), write)
    return report


def _section_entries(section: Section, root: Path, wanted: set[str] | None, allowed_archs: set[str] | None,
                     since: float | None, report: ExportReport) -> tuple[dict[str, dict[str, bytes]], dict[str, Any]]:
    """The verified entries of one section of `root` (Triton's, Helion's) to export, chosen as the
    kernel entries are, and their listing in the bundle manifest."""
    store = section.store_of(root)
    chosen: dict[str, dict[str, bytes]] = {}
    listing: dict[str, Any] = {}
    for key in sorted(store.keys() if wanted is None else wanted & set(store.keys())):
        try:
            files = store.read_with_manifest(key)
            if files is None:
                continue
            section.check_bound(key, files, Path(section.folder))
        except (CorruptEntry, BundleError, OSError) as err:
            report.skipped.append(key)
            log.warning("kcache: not exporting the %s entry %s: %s", section.owner.removesuffix("'s"), key[:16],
                        getattr(err, "reason", err))
            continue
        arch = section.arch(files)
        if not arch_allowed(arch, allowed_archs) or (since is not None and not section.created(files) >= since):
            continue
        chosen[key] = files
        listing[key] = {"kernel": section.kernel(files), "arch": arch,
                        "files": {name: [len(data), hashlib.sha256(data).hexdigest()]
                                  for name, data in sorted(files.items())}}
    return chosen, listing


def bundle_group_access(root: Path) -> int | None:
    """The group that may read a bundle of `root`'s kernels, or None: nobody but its owner. A group only
    where the root is shared by one: group mode (KCACHE_UMASK lets the group write) and a root its
    group may enter and read. Then it is the root's group."""
    if not sharing.group_mode():
        return None
    try:
        info = os.stat(root)
    except OSError:
        return None
    readable = stat.S_IRGRP | stat.S_IXGRP
    return info.st_gid if info.st_mode & readable == readable else None


def _write_bundle_file(bundle: Path, group: int | None, write: Callable[[tarfile.TarFile], None]) -> None:
    """`write(tar)` into a new file beside `bundle`, made private or readable by `group` (when this
    process may give the file that group), synced, and renamed over `bundle`."""
    try:
        directory_fd = os.open(bundle.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as err:
        raise BundleError(str(bundle), f"cannot write it: {err.strerror or err}") from err
    temporary = None
    try:
        fd, temporary = create_temporary_at(directory_fd, f".{bundle.name}", PRIVATE_BUNDLE_MODE)
        with os.fdopen(fd, "wb") as out:
            os.fchmod(fd, _shared_with(fd, group))  # exactly: the umask may have taken bits of the mode away
            with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
                write(tar)
            out.flush()
            os.fsync(fd)
        with signals_deferred():  # renamed means written: an interrupt now waits, then says so
            os.replace(temporary, bundle.name, src_dir_fd=directory_fd, dst_dir_fd=directory_fd)
            temporary = None
    except BaseException as err:
        if isinstance(err, Interrupted) and temporary is None:
            err.done = f"the bundle {bundle} was written whole before it stopped"
        if temporary is not None:
            with contextlib.suppress(OSError):
                os.unlink(temporary, dir_fd=directory_fd)
        if isinstance(err, OSError):
            raise BundleError(str(bundle), f"cannot write it: {err.strerror or err}") from err
        raise
    finally:
        os.close(directory_fd)


def _shared_with(fd: int, group: int | None) -> int:
    """The bundle's mode: GROUP_BUNDLE_MODE once the file is in `group`, else private (this process
    is not a member of the root's group, and may not give the file that group)."""
    if group is None:
        return PRIVATE_BUNDLE_MODE
    try:
        os.fchown(fd, -1, group)
    except OSError as err:
        if err.errno not in (errno.EPERM, errno.EACCES):
            raise
        log.warning("kcache: the bundle is private (0600): this process may not give it the root's group "
                    "(gid %d)", group)
        return PRIVATE_BUNDLE_MODE
    return GROUP_BUNDLE_MODE


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = 0o444
    info.mtime = 0  # the bundle's bytes depend on the entries only
    tar.addfile(info, io.BytesIO(data))
