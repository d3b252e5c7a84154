"""Which delegate runtime to run and whether `create` adds gpuckpt-hook (from the config, with a
start-up cache), and becoming the delegate.

Validating the config needs pydantic (~100 ms to import), too slow for the
`state` calls engines make all the time. The validated answer is cached in
the state directory, keyed by the config file's identity, PATH and the shim's
own path; any change to one of them validates again. The cache is a few
NUL-separated fields, not JSON: `json` costs ~7 ms of start-up.
"""

from __future__ import annotations

import os
import stat
import sys
import zlib

from ..errors import DelegateError
from ..host.programs import CommandError, exec_program, find_program
from ..node.hook_entry import hook_beside
from ..node.paths import config_path, state_dir

TYPE_CHECKING = False  # typing costs an import on every container operation
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import NoReturn

CACHE_NAME = "delegate.cache"  # one file per config path, PATH, launcher and name (".<crc32>" added by _cache_file)
CACHE_VERSION = "3"
KEY_CONFIG_IDENTITY = 2  # where _cache_key puts the config file's identity
# The runtimes the shim can delegate to, by podman's names for them. `gpuckpt install --engine podman --default`
# points each of them the node has at a link of that name to gpuckpt-runtime (an archive that names it goes
# through the shim under podman's own `restore --import`); called under such a name, the shim delegates to the
# program of that name, whatever the config's delegate.
DELEGATE_NAMES = ("crun", "runc")


def delegate_named(called_as: str) -> str:
    """The delegate a call's argv[0] names: its last component where that is one of DELEGATE_NAMES, else ""."""
    name = called_as.rpartition("/")[2]
    return name if name in DELEGATE_NAMES else ""


def _own_path() -> str:
    """This gpuckpt-runtime's real path ("" when it was started without one)."""
    return os.path.realpath(sys.argv[0]) if sys.argv and sys.argv[0] else ""


def _cache_key(config_file: str, named: str) -> list[str]:
    try:
        status = os.stat(config_file)
        identity = f"{status.st_dev}:{status.st_ino}:{status.st_size}:{status.st_mtime_ns}:{status.st_ctime_ns}"
    except FileNotFoundError:
        identity = "absent"
    return [CACHE_VERSION, config_file, identity, os.environ.get("PATH", ""), _own_path(), named]


class Resolved:
    """What a runtime call needs from the config: the delegate, and the hook `create` adds ("" for none)."""

    __slots__ = ("delegate", "hook")

    def __init__(self, delegate: str, hook: str) -> None:
        self.delegate, self.hook = delegate, hook


def _cache_file(key: list[str]) -> str:
    """The cache file of a config path, PATH and launcher: the engines call the runtime with PATHs of their own
    (podman, and conmon for a restore), and one file for all of them made each call undo the last one's entry
    (pydantic, 200 ms). The config file's identity is not in the name (it is in the file): a changed config
    replaces its entry instead of adding one."""
    lasting = [part for index, part in enumerate(key) if index != KEY_CONFIG_IDENTITY]
    return f"{CACHE_NAME}.{zlib.crc32(os.fsencode(chr(0).join(lasting))):08x}"  # PATH's own bytes, whatever they are


def _read_cache(key: list[str]) -> Resolved | None:
    try:
        # O_NONBLOCK: a FIFO there must not hang every container operation (refused below: not a regular file)
        fd = os.open(os.path.join(state_dir(), _cache_file(key)), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        status = os.fstat(fd)
        # Only trust a cache written by us and writable by nobody else.
        if status.st_uid != os.geteuid() or status.st_mode & 0o022 or not stat.S_ISREG(status.st_mode):
            return None
        fields = os.fsdecode(os.read(fd, 65536)).split("\0")
    except OSError:
        return None
    finally:
        os.close(fd)
    if fields[:-2] != key:
        return None
    delegate, hook = fields[-2:]
    return Resolved(delegate, hook) if delegate.startswith("/") and os.access(delegate, os.X_OK) else None


def _write_cache(key: list[str], resolved: Resolved) -> None:
    directory = state_dir()
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)
        temporary = os.path.join(directory, f".{CACHE_NAME}.{os.getpid()}")
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as cache_file:
            cache_file.write(os.fsencode("\0".join([*key, resolved.delegate, resolved.hook])))
        os.replace(temporary, os.path.join(directory, _cache_file(key)))
    except OSError:
        pass  # a cache we cannot write only costs start-up time


def resolve_delegate(delegate: str, config_file: str, named: str = "") -> str:
    """The executable path of the delegate (`named`, the one the call's name chose, else the configured one), or a
    DelegateError naming where it was set."""
    found = find_program(named or delegate, skip=_own_path() or None)
    if found is None:
        problem = (f"{delegate} is not an executable file" if delegate.startswith("/") and not named
                   else f"{named or delegate!r} not found on PATH ({os.environ.get('PATH', os.defpath)})")
        if named:
            raise DelegateError(f"delegate runtime {problem}; gpuckpt-runtime was called as {named}, the runtime it "
                                "stands in for (gpuckpt install --engine podman --default links it under that name)")
        raise DelegateError(
            f"delegate runtime {problem}; set 'delegate' in {config_file} "
            "to runc, crun or the absolute path of a runc-compatible runtime"
        )
    return found


def hook_beside_runtime() -> str:
    """gpuckpt-hook of this installation: the one beside the running gpuckpt-runtime."""
    return hook_beside(_own_path())


def resolve_runtime(called_as: str = "") -> Resolved:
    """The delegate's path and the hook for a call made under `called_as` (its argv[0]): from the cache when
    nothing they depend on changed."""
    config_file = config_path()
    named = delegate_named(called_as)
    key = _cache_key(config_file, named)
    cached = _read_cache(key)
    if cached:
        return cached
    from ..node.config import load_config  # pydantic: only on a cache miss

    config = load_config(config_file)
    if named == config.delegate.rpartition("/")[2]:
        named = ""  # the configured delegate is the runtime of that name (and may be given by its path)
    resolved = Resolved(resolve_delegate(config.delegate, config_file, named),
                        hook_beside_runtime() if config.hook.add_to_spec else "")
    _write_cache(key, resolved)
    return resolved


def exec_delegate(delegate: str, argv: Sequence[str]) -> NoReturn:
    """Become the delegate with argv unchanged (the pass-through); returns only by raising."""
    try:
        exec_program(delegate, argv)
    except CommandError as error:
        raise DelegateError(f"delegate runtime: {error}") from None
