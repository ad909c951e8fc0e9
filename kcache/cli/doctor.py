"""`kcache.doctor(root)`: what is wrong with a cache root, and how to fix it. No TileLang import."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from kcache.cli.doctor_environment import (
    Finding,
    helion_finding,
    settings_finding,
    toolchain_finding,
    triton_finding,
)
from kcache.cli.doctor_environment import installed_tilelang as installed_tilelang  # the CLI's, from here
from kcache.cli.format import human_size
from kcache.config import Settings
from kcache.maintenance.eviction import scan_entries
from kcache.maintenance.gc import collect_garbage, staging_dirs
from kcache.setting_values import default_root, remote_urls
from kcache.store import access, exec_copy, layout, sharing
from kcache.store.components import KERNELS
from kcache.store.trust import untrusted_reason

MIN_FREE_BYTES = 1 << 30


def doctor(root: str | os.PathLike[str] | Settings | None = None, *, fix: bool = False) -> list[Finding]:
    """Every condition of a cache root that can hurt, each with its fix: existence, who can write it
    and what kcache then does, trust, group sharing, noexec, free space, size, leftovers, the
    toolchain, the remote tier, the compile service, the classes TRITON_CACHE_MANAGER and
    HELION_REMOTE_CACHE_BACKEND name (kcache.cli.doctor_environment). `fix` repairs what is safe to
    repair (create the root, chmod o-w a root you own, gc)."""
    bad_value = None
    if isinstance(root, Settings):
        settings = root
    else:
        try:
            settings = Settings.from_env(root)
        except ValueError as err:  # a bad KCACHE_* value: reported, and the rest checked with the defaults
            bad_value = str(err)
            settings = Settings(root=Path(root).expanduser() if root is not None else default_root())
    findings = [settings_finding(bad_value)]  # one verdict for the settings, bad values and typos together
    findings.append(_tilelang_version())
    root = settings.root
    if root.is_symlink() and not root.exists():
        findings.append(Finding("root", True, f"{root} is a dangling symbolic link",
                                "point KCACHE_DIR or --dir at a directory"))
        return [*findings, _compile_service(settings)]
    if root.exists() and not root.is_dir():
        findings.append(Finding("root", True, f"{root} exists but is not a directory",
                                "point KCACHE_DIR or --dir at a directory, or move that file away"))
        return [*findings, _compile_service(settings)]
    unreadable = access.unreadable_reason(root)
    if unreadable:  # nothing below it can be checked: one finding that says why, and the fix
        findings.append(Finding("root", True, f"cannot read {root}: {unreadable}", access.unreadable_fix(root)))
        return [*findings, _compile_service(settings)]
    if not root.is_dir():
        finding = Finding("root", True, f"{root} does not exist", "create it (kcache does on first use)")
        if fix:
            access.create_root(root)
            finding.fixed = True
        findings.append(finding)
        if not finding.fixed:
            return [*findings, _compile_service(settings)]  # the service does not depend on the root
    findings.append(_writable(root, settings))
    findings.append(_trusted(root))
    info = os.stat(root)
    world_writable = bool(info.st_mode & stat.S_IWOTH)
    finding = Finding("mode", world_writable, f"{root} has mode {stat.filemode(info.st_mode)}",
                      f"chmod o-w {root}: any user could plant code in it")
    # Only a kcache root's own mode is fixed: never a shared tmp (sticky) or a directory without the marker.
    ours = (root / layout.ROOT_MARKER).is_file() and not info.st_mode & stat.S_ISVTX
    if world_writable and fix and info.st_uid == os.geteuid() and ours:
        os.chmod(root, info.st_mode & ~stat.S_IWOTH)
        finding.fixed = True
    findings.append(finding)
    findings.append(_group(root, info))
    findings.append(_exec(root))
    vfs = os.statvfs(root)
    free = vfs.f_bavail * vfs.f_frsize
    findings.append(Finding("free space", free < MIN_FREE_BYTES, f"{human_size(free)} free",
                            "free space, lower KCACHE_MAX_SIZE, or move KCACHE_DIR"))
    size = sum(e.size for e in scan_entries(root) + scan_entries(root, layout.TRITON))  # what eviction bounds, as stats
    over = settings.max_size_bytes is not None and size > settings.max_size_bytes
    limit = "no limit" if settings.max_size_bytes is None else human_size(settings.max_size_bytes)
    finding = Finding("size", over, f"{human_size(size)} of entries, limit {limit}", "kcache prune")
    leftovers = sum(len(os.listdir(d)) for d in staging_dirs(root)) + _count(root / layout.TRASH)
    cleanup = Finding("leftovers", leftovers > 0, f"{leftovers} staging or trash directories", "kcache gc")
    if fix and (over or leftovers):
        collect_garbage(root, settings.staging_ttl_s, settings.max_size_bytes, settings.max_age_s)
        finding.fixed, cleanup.fixed = over, leftovers > 0
    findings += [finding, cleanup]
    findings.append(toolchain_finding())
    findings += _remotes(settings.remote_url)
    findings.append(_compile_service(settings))
    findings.append(triton_finding())
    helion = helion_finding()
    return findings + ([helion] if helion else [])


def _writable(root: Path, settings: Settings) -> Finding:
    reason = access.unwritable_reason(root)
    if not reason:
        return Finding("writable", False, f"{root} is writable by you")
    policy = settings.on_unwritable
    outcome = {
        "fallback": f"kcache reads its hits and writes new kernels to {access.fallback_root(root)} "
                    "(KCACHE_ON_UNWRITABLE=fallback)",
        "readonly": "kcache reads its hits and compiles misses without saving them (KCACHE_ON_UNWRITABLE=readonly)",
        "error": "opening it raises UnwritableCache (KCACHE_ON_UNWRITABLE=error)",
    }[policy]
    return Finding("writable", True, f"not writable by you: {reason}; {outcome}", access.unwritable_fix(reason, policy, root))


def _trusted(root: Path) -> Finding:
    for directory in (root, root / KERNELS):
        distrust = untrusted_reason(directory, root) if directory.is_dir() else ""
        if distrust:
            return Finding("trust", True, f"kcache will not load code from {root}: {distrust}",
                           "chmod o-w the directories, give them to this user, or share them through a group "
                           "(KCACHE_UMASK)")
    return Finding("trust", False, f"{root} passes the trust check (kernels load from it)")


def _group(root: Path, info: os.stat_result) -> Finding:
    group_writable = bool(info.st_mode & stat.S_IWGRP)
    if not sharing.group_mode():
        if group_writable:
            # Not a problem by itself (user-private groups make 0775 the norm), but a half-done share.
            return Finding("group", False, f"{root} is group-writable, but KCACHE_UMASK is not set: what you create "
                           "there stays writable by you alone (other members cannot take your lock files)",
                           "if the root is shared: export KCACHE_UMASK=002 for every member (docs/operations.md)")
        return Finding("group", False, "private root (KCACHE_UMASK not set)")
    problems = []
    if not group_writable:
        problems.append("the root is not group-writable (chmod g+w)")
    if not info.st_mode & stat.S_ISGID:
        problems.append("the root is not setgid, so new files would get each user's own group (chmod g+s)")
    if sharing.trusted_group(root) is None:
        problems.append(f"you are not a member of its group (gid {info.st_gid}) or of KCACHE_GROUP")
    detail = f"group mode (KCACHE_UMASK={os.environ.get(sharing.UMASK_ENV)}), group gid {info.st_gid}"
    return Finding("group", bool(problems), detail + (": " + "; ".join(problems) if problems else ""),
                   f"chgrp <team> {root} && chmod 2770 {root}; add every user to the group")


def _exec(root: Path) -> Finding:
    mount = exec_copy.noexec_mount(root)
    if mount is None:
        return Finding("exec", False, f"the filesystem of {root} allows mapping code")
    return Finding("exec", False, f"{root} is on the noexec mount {mount}: kernels are loaded from in-memory copies "
                   "of their verified files (one warning per process)",
                   "point KCACHE_DIR at a filesystem mounted with exec to load kernels in place")


def _remotes(value: str | None) -> list[Finding]:
    """One finding for each remote tier of KCACHE_REMOTE."""
    try:
        urls = remote_urls(value)
    except ValueError as err:
        return [Finding("remote", True, str(err), "fix KCACHE_REMOTE")]
    if not urls:
        return [Finding("remote", False, "no remote tier configured (KCACHE_REMOTE)")]
    return [_s3(url) if url.lower().startswith("s3://") else _redis(url) for url in urls]


def _redis(url: str) -> Finding:
    try:
        import redis

        redis.Redis.from_url(url, socket_timeout=1.0, socket_connect_timeout=1.0).ping()
    except ImportError:
        return Finding("remote", True, f"KCACHE_REMOTE={url} but redis-py is not installed", "pip install 'kcache-gpu[remote]'")
    except (redis.RedisError, OSError) as err:
        return Finding("remote", True, f"{url} is unreachable: {err}", "start Redis or fix KCACHE_REMOTE")
    return Finding("remote", False, f"{url} answers")


def _s3(url: str) -> Finding:
    from kcache.tiers.s3_bucket import BucketCheckFailed, S3UrlError, check_bucket

    try:
        import obstore  # noqa: F401
    except ImportError:
        return Finding("remote", True, f"KCACHE_REMOTE has {url} but obstore is not installed", "pip install 'kcache-gpu[s3]'")
    try:
        return Finding("remote", False, check_bucket(url))
    except (BucketCheckFailed, S3UrlError) as err:
        return Finding("remote", True, str(err), "check AWS_ENDPOINT_URL, AWS_REGION, the credentials and the "
                       "bucket policy (kcache needs GetObject, PutObject and DeleteObject under the prefix)")


def _compile_service(settings: Settings) -> Finding:
    """The compile service of this environment: reachable, running, its workers and memory."""
    from kcache.compile.jobs import usable_cpu_count
    from kcache.compile.pool.process_pool import TILELANG_PRELOAD
    from kcache.compile.runtime_dir import NoServiceDirectory
    from kcache.compile.service import address
    from kcache.compile.service import connection as service_connection

    used = settings.compile_isolation == "server"
    name = address.identity(TILELANG_PRELOAD, settings.compile_workers or usable_cpu_count())
    try:
        where = address.socket_path(name)
    except NoServiceDirectory as err:
        return Finding("compile service", used, str(err),
                       "set XDG_RUNTIME_DIR to a private directory of yours" if used else "")
    try:
        status = service_connection.request(name, ("status",))
    except (OSError, EOFError):
        how = "starts on the first compile, or with `kcache server start`" if used else \
            "not used (KCACHE_COMPILE_ISOLATION=server uses it)"
        return Finding("compile service", False, f"not running ({where}); {how}")
    budget = status.get("memory_budget_bytes")
    memory = f"{status['worker_memory_bytes'] / (1 << 30):.2f} GiB" + (f" of {budget / (1 << 30):.1f} GiB" if budget else "")
    forked = f", forked from template {status['template_pid']}" if status.get("template_pid") else ", started by exec"
    return Finding("compile service", False,
                   f"running: pid {status['pid']}, up {status['uptime_s']:.0f} s, {status['workers']} of "
                   f"{status['max_workers']} workers{forked}, {memory}; {status['running']} running, "
                   f"{status['queued']} queued, {status['jobs']} jobs served ({where})")


def _tilelang_version() -> Finding:
    """Whether the installed TileLang is of the versions kcache supports (kcache/tilelang/support.py;
    read from its metadata, no import): outside them, TileLang's compiles pass kcache by."""
    from kcache.tilelang import support

    version = support.installed_version()
    problem = support.version_problem()
    if problem is not None:
        return Finding("tilelang version", True, problem.rpartition(": ")[0] + ": kcache.install() and `kcache run` "
                       "pass its compiles to plain TileLang, uncached, and get_or_compile refuses", support.FIX)
    return Finding("tilelang version", False, f"TileLang {version or 'not installed'}; kcache supports {support.SUPPORTED}")


def _count(directory: os.PathLike[str]) -> int:
    try:
        return len(os.listdir(directory))
    except FileNotFoundError:
        return 0
