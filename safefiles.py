"""Files written and read by root where others may have put something: never through a link.

Created new (O_EXCL after removing what was there), so a stale or planted file (another mode,
another owner, a symlink) can never lend the new one its permissions; read only when regular,
and never more than a bound.
"""

from __future__ import annotations

import os

from gpuckpt.errors import ImageError


def create_private(path: str) -> int:
    """A new 0600 file at `path` (anything there before is removed); its descriptor, for writing."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)


def replace_private(path: str, text: str) -> None:
    """`text` into `path` at once for any reader (written beside it, then renamed), root-only."""
    temporary = f"{path}.{os.getpid()}.tmp"
    with os.fdopen(create_private(temporary), "w", encoding="utf-8") as out:
        out.write(text)
    os.replace(temporary, path)


def read_bounded(path: str, limit: int, what: str) -> bytes:
    """A regular file's bytes, at most `limit`; never through a link, never a FIFO or device."""
    import stat

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as error:
        raise ImageError(f"{what}: cannot read: {error.strerror}") from None
    with os.fdopen(fd, "rb") as source:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ImageError(f"{what}: not a regular file")
        data = source.read(limit + 1)
    if len(data) > limit:
        raise ImageError(f"{what}: larger than {limit} bytes")
    return data
