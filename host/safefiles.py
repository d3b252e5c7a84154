"""Files written and read by root where others may have put something: never through a link.

Created new (O_EXCL after removing what was there), so a stale or planted file (another mode,
another owner, a symlink) can never lend the new one its permissions; read only when regular,
and never more than a bound.
"""

from __future__ import annotations

import contextlib
import os
import stat

from ..errors import ConfigError, GpuckptError, ImageError


def create_new(path: str, mode: int = 0o600) -> int:
    """A new file at `path` (anything there before is removed), `mode` whatever the umask; its
    descriptor, for writing."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    os.fchmod(fd, mode)
    return fd


def replace_file(path: str, text: str | bytes, mode: int = 0o600) -> None:
    """`text` into `path` at once for any reader (written beside it, then renamed); root-only
    unless `mode` says otherwise."""
    temporary = f"{path}.{os.getpid()}.tmp"
    with os.fdopen(create_new(temporary, mode), "wb") as out:
        out.write(text.encode() if isinstance(text, str) else text)
    os.replace(temporary, path)


def read_bounded(path: str, limit: int, what: str) -> bytes:
    """A regular file's bytes, at most `limit`; never through a link, never a FIFO or device."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as error:
        raise ImageError(f"{what}: cannot read: {error.strerror}") from None
    return read_regular(fd, limit, what)


def read_regular(fd: int, limit: int, what: str) -> bytes:
    """The bytes of the file open at `fd` (closed after), at most `limit`, if it is a regular file."""
    with os.fdopen(fd, "rb") as source:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ImageError(f"{what}: not a regular file")
        data = source.read(limit + 1)
    if len(data) > limit:
        raise ImageError(f"{what}: larger than {limit} bytes")
    return data


# Output paths: the directory the operator names is followed (a link there is the operator's
# choice); below it, every directory and file is made here and reached through descriptors,
# never through a name that something swapped for a link in the meantime.
_DIRECTORY_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC


def open_directory(path: str) -> int:
    """A descriptor of an existing directory the operator named (links followed)."""
    return os.open(path, _DIRECTORY_FLAGS)


def make_directory_at(parent_fd: int, name: str, mode: int = 0o700) -> tuple[int, bool]:
    """The directory `name` in `parent_fd`, made now (mkdirat) or already there, opened without
    following a link (ELOOP/ENOTDIR if one is there); its descriptor, and whether it was made now."""
    try:
        os.mkdir(name, mode, dir_fd=parent_fd)
        made = True
    except FileExistsError:
        made = False
    return os.open(name, _DIRECTORY_FLAGS | os.O_NOFOLLOW, dir_fd=parent_fd), made


def make_directories(path: str, mode: int = 0o700) -> tuple[int, int, bool]:
    """`path` as a directory: its nearest existing ancestor is followed (the operator's), each
    missing directory below it, `path` included, made by mkdirat and opened without following.
    Returns the descriptors of its parent and of itself, and whether it was made now."""
    parent, name = os.path.split(os.path.abspath(path))
    missing = []
    while not os.path.isdir(parent):
        parent, component = os.path.split(parent)
        missing.append(component)
    parent_fd = open_directory(parent)
    try:
        for component in reversed(missing):
            fd, _ = make_directory_at(parent_fd, component, mode)
            os.close(parent_fd)
            parent_fd = fd
        return parent_fd, *make_directory_at(parent_fd, name, mode)
    except BaseException:
        os.close(parent_fd)
        raise


def require_private(fd: int, path: str) -> None:
    """The directory `fd` (named `path`) is this user's and nobody else may write in it, nor move it
    or a directory above it (a link put in its place sends what root does there by path elsewhere):
    what root keeps there (checkpoints it restores at boot) cannot have been put there by another user."""
    status = os.fstat(fd)
    if status.st_uid != os.geteuid() or status.st_mode & 0o022:
        raise ConfigError(f"{path}: owned by uid {status.st_uid}, mode {stat.S_IMODE(status.st_mode):o}: "
                          f"checkpoints are kept only where uid {os.geteuid()} alone may write "
                          f"(chown {os.geteuid()} and chmod go-w it, or name another directory)")
    _require_path_not_movable_by_others(path, ConfigError)


def require_image_directory_private(path: str, what: str, make: bool = False) -> None:
    """A checkpoint's image directory, which root signs at dump and verifies, then parses, at restore, by
    name: refused unless it exists (made here first with `make`, as runc would, so that nobody else can make
    it in between) and only root (or this user) may write in it, move it or a directory above it, or swap a
    link on the way: what another user changed between the signature and the reading would be read as
    signed. A '..' is refused: the kernel takes it after a link, a check of the path as text before it."""
    if ".." in path.split("/"):
        raise ImageError(f"{what}: {path}: an image path with '..' is refused (name the directory itself)")
    absolute = os.path.abspath(path)
    if make and not os.path.isdir(absolute):  # one there (containerd's work path is a link of its own) is judged
        _require_path_not_movable_by_others(absolute, ImageError, what)  # before anything is made below it
        try:
            parent_fd, fd, _ = make_directories(absolute, 0o700)  # missing ones made without following a link
        except OSError as error:
            raise ImageError(f"{what}: {absolute}: cannot make the image directory: {error.strerror}") from None
        os.close(parent_fd)
        os.close(fd)
    try:
        status = os.stat(absolute)
    except FileNotFoundError:
        raise ImageError(f"{what}: {absolute} does not exist: no checkpoint images there") from None
    except OSError as failure:
        raise _unexaminable(failure, absolute, what, ImageError) from None
    if not stat.S_ISDIR(status.st_mode):
        raise ImageError(f"{what}: {absolute}: not a directory")
    if status.st_uid not in (0, os.geteuid()) or status.st_mode & 0o022:
        raise ImageError(f"{what}: {absolute}: owned by uid {status.st_uid}, mode {stat.S_IMODE(status.st_mode):o}: "
                         f"checkpoint images are written and read only where no other user may write "
                         f"(chown root and chmod go-w it, or name another directory)")
    _require_path_not_movable_by_others(absolute, ImageError, what)  # as it is there, written and resolved


def _require_path_not_movable_by_others(path: str, error: type[GpuckptError], what: str = "") -> None:
    """Every directory `path` passes through, as written and as the links resolve now, and every link on
    the way as written: none can be moved or swapped by a user other than root or this one."""
    absolute = os.path.abspath(path)
    for named in (absolute, os.path.realpath(absolute)):
        above = named
        while above != os.path.dirname(above):
            try:
                link = os.lstat(above)
            except FileNotFoundError:
                link = None
            except OSError as failure:
                raise _unexaminable(failure, above, what, error) from None
            if link is not None and stat.S_ISLNK(link.st_mode) and link.st_uid not in (0, os.geteuid()):
                raise error(f"{what}{': ' if what else ''}{above}: a link owned by uid {link.st_uid}, who may point "
                            f"it elsewhere at any time (name the directory it leads to)")
            above = os.path.dirname(above)
            _require_not_movable_by_others(above, path, error, what)


def not_movable_by_others(path: str) -> bool:
    """Whether no user but root (or this one) can move or swap `path` or a directory it passes through."""
    try:
        _require_path_not_movable_by_others(path, GpuckptError)
    except GpuckptError:
        return False
    return True


def _unexaminable(failure: OSError, path: str, what: str, error: type[GpuckptError]) -> GpuckptError:
    """The refusal of a path whose parts cannot be looked at (not the error of a crash)."""
    return error(f"{what}{': ' if what else ''}{path}: cannot be examined ({failure.strerror}): refused")


def _require_not_movable_by_others(directory: str, path: str, error: type[GpuckptError] = ConfigError,
                                   what: str = "") -> None:
    try:
        status = os.stat(directory)
    except FileNotFoundError:
        return  # judged by what is above it, where whoever makes it makes it
    except OSError as failure:  # a link another user put in a sticky directory (fs.protected_symlinks), ...
        raise _unexaminable(failure, directory, what, error) from None
    if status.st_uid not in (0, os.geteuid()) or (status.st_mode & 0o022 and not status.st_mode & stat.S_ISVTX):
        raise error(f"{what}{': ' if what else ''}{directory}: mode {stat.S_IMODE(status.st_mode):o}: owned by uid "
                    f"{status.st_uid}, another user may move {path} (or a directory above it) away and put a link "
                    f"there (chmod go-w or +t it, or name another directory)")


def private_directory(path: str) -> int:
    """make_directories(path), checked with require_private: its descriptor."""
    parent_fd, fd, _ = make_directories(path, 0o700)
    os.close(parent_fd)
    try:
        require_private(fd, path)
    except BaseException:
        os.close(fd)
        raise
    return fd


def create_private_at(dir_fd: int, name: str) -> int:
    """create_new, in the directory `dir_fd`."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(name, dir_fd=dir_fd)
    return os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dir_fd)


def write_private_at(dir_fd: int, name: str, data: bytes) -> None:
    """`data` as a new root-only file `name` in the directory `dir_fd`."""
    with os.fdopen(create_private_at(dir_fd, name), "wb") as out:
        out.write(data)
