"""One writer per output: a lock file held for a run's whole life.

The lock is flock(2) on a file beside the output (`REGEN.jsonl.lock`) or in
the output directory (`DIR/.dflash-prepare.lock`), the file recording the
holder (command, pid, host, start time) so that a second run is refused with
a message naming it. The kernel drops the lock however the holder ends; the
record stays only where the holder was killed, and such a stale record is
taken over with a note when it names this host and its process is gone (or
the kernel lock was free). A record from another host is refused: over a
network file system this host cannot tell whether that process still runs.
A run that ends normally removes the file.
"""
import fcntl
import json
import os
import socket
import time

from .errors import UserError, note

DIRECTORY_LOCK = ".dflash-prepare.lock"


def _pid_running(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    return True


def _describe(holder):
    if not holder:
        return "a process that has not written its name yet"
    return (f"dflash-prepare {holder.get('command', '?')}, process {holder.get('pid', '?')} "
            f"on {holder.get('host', '?')}, started {holder.get('started', '?')}")


class OutputLock:
    """The lock of the lock file `path`, for `command` (a context manager)."""

    def __init__(self, path, command):
        self.path = path
        self.command = command
        self.fd = None

    def __enter__(self):
        self.acquire()
        return self

    def __exit__(self, *exc):
        self.release()

    def _read_holder(self, fd):
        try:
            text = os.pread(fd, 4096, 0).decode("utf-8", "replace").strip()
        except OSError:
            return None
        if not text:
            return None
        try:
            holder = json.loads(text)
        except ValueError:
            return {"pid": "?", "host": "?", "started": "?", "command": text[:80]}
        return holder if isinstance(holder, dict) else None

    def _open_locked(self):
        """(fd, kernel_locked): the lock file opened and flock'd where the
        file system has flock; refuses while another process holds it."""
        for _ in range(10):
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            except OSError as error:
                raise UserError(f"{self.path}: cannot create the lock file: "
                                f"{error.strerror}") from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                kernel_locked = True
            except BlockingIOError:
                holder = self._read_holder(fd)
                os.close(fd)
                raise UserError(f"{self.path}: the output is in use by {_describe(holder)}; "
                                "wait for it to end, or give another --out") from None
            except OSError:
                kernel_locked = False  # no flock here: the record alone decides
            # A holder that ended meanwhile removed the file we opened: lock
            # the file that is there now instead.
            try:
                same = os.stat(self.path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                return fd, kernel_locked
            os.close(fd)
        raise UserError(f"{self.path}: the lock file keeps being replaced; is another "
                        "run starting and stopping?")

    def acquire(self):
        fd, kernel_locked = self._open_locked()
        try:
            holder = self._read_holder(fd)
            host = socket.gethostname()
            if holder:
                pid = holder.get("pid")
                if holder.get("host") != host:
                    raise UserError(
                        f"{self.path}: the output is in use by {_describe(holder)} (another "
                        "host: whether it still runs cannot be told from here); if that run "
                        f"has ended, remove {self.path}")
                alive = isinstance(pid, int) and pid != os.getpid() and _pid_running(pid)
                if alive and not kernel_locked:
                    raise UserError(f"{self.path}: the output is in use by "
                                    f"{_describe(holder)}; wait for it to end, or give "
                                    "another --out")
                note(f"{self.path}: took over the lock of {_describe(holder)}, which "
                     "ended without releasing it")
            record = {"command": self.command, "pid": os.getpid(), "host": host,
                      "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}
            data = (json.dumps(record) + "\n").encode()
            try:
                os.ftruncate(fd, 0)
                os.pwrite(fd, data, 0)
                os.fsync(fd)
            except OSError as error:
                raise UserError(f"{self.path}: cannot write the lock file: "
                                f"{error.strerror}") from None
        except BaseException:
            os.close(fd)
            raise
        self.fd = fd

    def release(self):
        if self.fd is None:
            return
        try:
            if os.stat(self.path).st_ino == os.fstat(self.fd).st_ino:
                os.remove(self.path)
        except OSError:
            pass  # gone, or not removable: the next run takes the record over
        os.close(self.fd)  # closing drops the flock
        self.fd = None


def make_output_directory(directory):
    """Makes the output directory `directory` where it is missing; returns
    the folders made, deepest first (to remove again where a run wrote
    nothing). A path that exists as something else, or a directory that
    cannot be made, is one line."""
    if os.path.exists(directory) and not os.path.isdir(directory):
        raise UserError(f"{directory}: not a directory (the output is a directory "
                        "of shards)")
    made = []
    parent = os.path.abspath(directory)
    while not os.path.exists(parent):
        made.append(parent)
        parent = os.path.dirname(parent)
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError as error:
        raise UserError(f"{directory}: cannot create the output directory: "
                        f"{error.strerror or error}") from None
    return made


class DirectoryLock:
    """The lock of an output directory, made here where it is missing; on
    release the folders made are removed again where they stayed empty (a
    run that stopped before writing leaves no empty directory)."""

    def __init__(self, directory, command):
        self.directory = directory
        self.lock = OutputLock(os.path.join(directory, DIRECTORY_LOCK), command)
        self.made = []

    def __enter__(self):
        self.made = make_output_directory(self.directory)
        try:
            self.lock.acquire()
        except BaseException:
            self._remove_made()
            raise
        return self

    def __exit__(self, *exc):
        self.lock.release()
        self._remove_made()

    def _remove_made(self):
        for folder in self.made:
            try:
                os.rmdir(folder)
            except OSError:
                return  # not empty, or gone: it stays
