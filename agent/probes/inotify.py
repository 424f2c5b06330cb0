"""inotify(7) through libc: wake when a file is written, truncated, replaced or removed, instead of
polling it. Linux only; `FileChanges.open` answers None where inotify is not available (another OS,
no libc symbol, the watch limit reached), and the caller polls instead.

The file's directory is watched, not the file: an append or a truncation is IN_MODIFY on its name,
a replacement (rename over it) is IN_MOVED_TO, a new file IN_CREATE, so one watch follows the path
whatever happens to the inode behind it.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import os
import select
import struct

IN_MODIFY = 0x00000002
IN_ATTRIB = 0x00000004
IN_CLOSE_WRITE = 0x00000008
IN_MOVED_FROM = 0x00000040
IN_MOVED_TO = 0x00000080
IN_CREATE = 0x00000100
IN_DELETE = 0x00000200
IN_DELETE_SELF = 0x00000400
IN_MOVE_SELF = 0x00000800
IN_Q_OVERFLOW = 0x00004000
IN_IGNORED = 0x00008000
ON_THE_FILE = IN_MODIFY | IN_ATTRIB | IN_CLOSE_WRITE | IN_MOVED_FROM | IN_MOVED_TO | IN_CREATE | IN_DELETE
ON_THE_DIRECTORY = IN_DELETE_SELF | IN_MOVE_SELF | IN_Q_OVERFLOW | IN_IGNORED  # say "look" too
EVENT = struct.Struct("iIII")  # struct inotify_event: wd, mask, cookie, len; then len bytes of name


def _libc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.inotify_init1.argtypes = [ctypes.c_int]
        libc.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
    except (OSError, AttributeError):
        return None
    return libc


class FileChanges:
    """An inotify descriptor watching one file's directory, filtered to that file's name."""

    def __init__(self, fd: int, name: bytes) -> None:
        self.fd = fd
        self.name = name

    @classmethod
    def open(cls, path: str) -> FileChanges | None:
        libc = _libc()
        if libc is None:
            return None
        fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if fd < 0:
            return None
        directory, name = os.path.split(os.path.abspath(path))
        if libc.inotify_add_watch(fd, os.fsencode(directory), ON_THE_FILE | ON_THE_DIRECTORY) < 0:
            os.close(fd)  # ENOSPC (fs.inotify.max_user_watches), ENOENT, EACCES
            return None
        return cls(fd, os.fsencode(name))

    def changed(self) -> bool:
        """Read every queued event; True when one was about the file (or the directory itself)."""
        hit = False
        while True:
            try:
                data = os.read(self.fd, 64 * 1024)
            except BlockingIOError:
                return hit
            except OSError as exc:
                if exc.errno == errno.EINTR:
                    continue
                raise
            if not data:
                return hit
            at = 0
            while at + EVENT.size <= len(data):
                _, mask, _, size = EVENT.unpack_from(data, at)
                name = data[at + EVENT.size : at + EVENT.size + size].rstrip(b"\0")
                hit = hit or bool(mask & ON_THE_DIRECTORY) or name == self.name
                at += EVENT.size + size

    def wait(self, timeout_s: float, *also: int) -> bool:
        """Block until the file changes, one of the *also* descriptors is readable, or the timeout;
        True when the file changed."""
        poller = select.poll()
        poller.register(self.fd, select.POLLIN)
        for fd in also:
            poller.register(fd, select.POLLIN)
        ready = {fd for fd, _ in poller.poll(timeout_s * 1000)}
        return self.fd in ready and self.changed()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.fd)
