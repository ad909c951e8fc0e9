"""`kcache.doctor(settings)`: what is wrong with a cache root, and how to fix it. No TileLang import."""

from __future__ import annotations

import os
import shutil
import stat
from dataclasses import dataclass

from .config import Settings
from .eviction import TRASH, scan_entries
from .fsutil import ensure_dir
from .maintenance import collect_garbage, staging_dirs

MIN_FREE_BYTES = 1 << 30


@dataclass
class Finding:
    check: str
    problem: bool
    detail: str
    fix: str = ""
    fixed: bool = False


def doctor(settings: Settings, *, fix: bool = False) -> list[Finding]:
    root = settings.root
    findings: list[Finding] = []
    if not root.is_dir():
        finding = Finding("root", True, f"{root} does not exist", "create it (kcache does on first use)")
        if fix:
            ensure_dir(root)
            os.chmod(root, 0o700)
            finding.fixed = True
        findings.append(finding)
        if not finding.fixed:
            return findings
    info = os.stat(root)
    me = os.geteuid()
    findings.append(Finding("owner", info.st_uid != me,
                            f"{root} is owned by uid {info.st_uid}" + ("" if info.st_uid == me else f", not by you (uid {me})"),
                            "use a root of your own (KCACHE_DIR), or share it through a group (see operations.md)"))
    world_writable = bool(info.st_mode & stat.S_IWOTH)
    finding = Finding("mode", world_writable, f"{root} has mode {stat.filemode(info.st_mode)}",
                      f"chmod o-w {root}: any user could plant code in it")
    if world_writable and fix and info.st_uid == me:
        os.chmod(root, info.st_mode & ~stat.S_IWOTH)
        finding.fixed = True
    findings.append(finding)
    writable = os.access(root, os.W_OK | os.X_OK)
    findings.append(Finding("writable", not writable, f"{root} is {'' if writable else 'not '}writable by you",
                            "fix its permissions or point KCACHE_DIR at a writable directory"))
    vfs = os.statvfs(root)
    noexec = bool(vfs.f_flag & os.ST_NOEXEC)
    findings.append(Finding("exec", noexec, f"the filesystem of {root} is mounted {'noexec' if noexec else 'with exec'}",
                            "point KCACHE_DIR at a filesystem mounted with exec (kernels are shared libraries)"))
    free = vfs.f_bavail * vfs.f_frsize
    findings.append(Finding("free space", free < MIN_FREE_BYTES, f"{free / (1 << 30):.1f} GiB free",
                            "free space, lower KCACHE_MAX_SIZE, or move KCACHE_DIR"))
    size = sum(e.size for e in scan_entries(root))
    over = settings.max_size_bytes is not None and size > settings.max_size_bytes
    finding = Finding("size", over, f"{size / (1 << 20):.1f} MiB of entries, limit "
                      f"{'unbounded' if settings.max_size_bytes is None else f'{settings.max_size_bytes / (1 << 20):.0f} MiB'}",
                      "kcache prune")
    leftovers = sum(len(os.listdir(d)) for d in staging_dirs(root)) + _count(root / TRASH)
    cleanup = Finding("leftovers", leftovers > 0, f"{leftovers} staging or trash directories", "kcache gc")
    if fix and (over or leftovers):
        collect_garbage(root, settings.staging_ttl_s, settings.max_size_bytes, settings.max_age_s)
        finding.fixed, cleanup.fixed = over, leftovers > 0
    findings += [finding, cleanup]
    findings.append(_toolchain())
    findings.append(_remote(settings.remote_url))
    return findings


def _remote(url: str | None) -> Finding:
    if not url:
        return Finding("remote", False, "no remote tier configured (KCACHE_REMOTE)")
    try:
        import redis

        redis.Redis.from_url(url, socket_timeout=1.0, socket_connect_timeout=1.0).ping()
    except ImportError:
        return Finding("remote", True, f"KCACHE_REMOTE={url} but redis-py is not installed", "pip install 'kcache[remote]'")
    except (redis.RedisError, OSError) as err:
        return Finding("remote", True, f"{url} is unreachable: {err}", "start Redis or fix KCACHE_REMOTE")
    return Finding("remote", False, f"{url} answers")


def installed_tilelang() -> str | None:
    """The installed TileLang's version, from its package metadata (no import)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("tilelang")
    except PackageNotFoundError:
        return None


def _toolchain() -> Finding:
    version = installed_tilelang()
    nvcc = shutil.which("nvcc") or (os.path.join(os.environ["CUDA_HOME"], "bin", "nvcc") if os.environ.get("CUDA_HOME") else None)
    problem = version is None or nvcc is None
    detail = f"TileLang {version or 'not installed'}; nvcc {nvcc or 'not found'}"
    return Finding("toolchain", problem, detail, "install TileLang, and put nvcc on PATH or set CUDA_HOME")


def _count(directory: os.PathLike[str]) -> int:
    try:
        return len(os.listdir(directory))
    except FileNotFoundError:
        return 0
