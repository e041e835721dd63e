"""The manifest of an output directory: which shards are complete, for which
run, so that an interrupted run continues where it stopped.

`manifest.json` is rewritten atomically after every shard. A run whose
fingerprint (inputs, options, tokenizer or target, spec) matches keeps the
shards it lists; a different run refuses the directory unless told to
overwrite it.
"""
import contextlib
import hashlib
import json
import os

from .errors import Interrupted, UserError, note
from .output_lock import make_output_directory
from .shards import AtomicFile, WriteFailed, remove_stale_temps, write_json_atomically

MANIFEST = "manifest.json"


def fingerprint(value):
    text = json.dumps(value, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def file_identity(path):
    """What tells one input file from another without reading it."""
    info = os.stat(path)
    return [os.path.abspath(path), info.st_size, info.st_mtime_ns]


def file_sha256(path):
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            while True:
                chunk = f.read(1 << 20)
                if not chunk:
                    break
                digest.update(chunk)
    except OSError as error:
        raise UserError(f"{path}: cannot read: {error.strerror or error}") from None
    return digest.hexdigest()


def _remove(path):
    try:
        os.remove(path)
    except OSError as error:
        raise UserError(f"{path}: cannot remove: {error.strerror or error}") from None


class Manifest:
    def __init__(self, directory, kind, print_fingerprint, overwrite):
        """Opens `directory` for a run of `kind` ("tokens" or "features")
        with `print_fingerprint` and decides what is kept."""
        self.directory = directory
        self.path = os.path.join(directory, MANIFEST)
        self.kind = kind
        self.fingerprint = print_fingerprint
        self.planned = None  # the run's shard count, once known (for `kept`)
        # The folders this run makes, deepest first: discard_if_unused
        # removes them again where nothing was written.
        self.made = make_output_directory(directory)
        try:
            removed = remove_stale_temps(directory)
            existing = sorted(n for n in os.listdir(directory) if n.endswith(".safetensors"))
        except OSError as error:
            raise UserError(f"{directory}: cannot list the output directory: "
                            f"{error.strerror or error}") from None
        if removed:
            note(f"{directory}: removed {removed} half-written file(s) of an "
                 "interrupted run")
        old = None
        if os.path.exists(self.path):
            try:
                with open(self.path) as f:
                    old = json.load(f)
                if not isinstance(old, dict):
                    raise ValueError
            except (OSError, ValueError, RecursionError):
                raise UserError(f"{self.path}: unreadable manifest; remove the "
                                "directory or pick another") from None
        same = (old is not None and old.get("kind") == kind and
                old.get("fingerprint") == print_fingerprint)
        self.shards = {}
        self.complete = False
        self.report = {}
        if same:
            listed = old.get("shards")
            listed = listed if isinstance(listed, dict) else {}
            for name, entry in listed.items():
                path = os.path.join(directory, name)
                if isinstance(entry, dict) and (entry.get("empty") or (
                        os.path.isfile(path) and os.path.getsize(path) == entry.get("bytes"))):
                    self.shards[name] = entry
            self.complete = bool(old.get("complete")) and len(self.shards) == len(listed)
            self.report = old.get("report") or {}
            doomed = [n for n in existing if n not in self.shards]  # not this run's
        elif (old is not None or existing) and not overwrite:
            why = ("holds the shards of a different run (its manifest.json "
                   "does not match these inputs and options)" if old is not None
                   else "already holds *.safetensors files but no manifest.json")
            raise UserError(f"{directory}: {why}; use an empty directory, or "
                            "--overwrite to replace them")
        else:
            doomed = existing
        if not self.complete or doomed:
            # A read-only directory is found now, before the slow part of the
            # run and before anything in it is removed.
            try:
                AtomicFile(self.path).abort()
            except WriteFailed as error:
                raise UserError(f"{directory}: cannot write into the output directory: "
                                f"{error.why}") from None
        for name in doomed:
            _remove(os.path.join(directory, name))
        if not same and old is not None:
            _remove(self.path)
        if not same and (old is not None or existing):
            note(f"{directory}: removed {len(existing)} shard(s) of an earlier run (--overwrite)")

    def kept(self):
        """What a run that stops early leaves for the next, one phrase: the
        shards manifest.json on disk lists and has (what the next run keeps;
        a stop can come after a shard's rename and before its manifest's,
        or the other way round)."""
        try:
            with open(self.path) as f:
                listed = json.load(f).get("shards") or {}
        except (OSError, ValueError, AttributeError):
            listed = {}
        done = sum(1 for name, entry in listed.items()
                   if isinstance(entry, dict) and not entry.get("empty")
                   and os.path.isfile(os.path.join(self.directory, name)))
        if not done:
            return f"no shard finished in {self.directory}"
        of = f" of {self.planned}" if self.planned is not None else ""
        return f"{self.directory} keeps {done}{of} finished shard(s), listed in its {MANIFEST}"

    def discard_if_unused(self):
        """Removes the output directory (and the folders above it) that this
        run made where it is still empty: a run that stopped before its
        first shard leaves no empty directory behind."""
        for folder in self.made:
            try:
                os.rmdir(folder)
            except OSError:
                return  # not empty, or gone: it stays

    def done(self, name):
        return name in self.shards

    def record(self, name, entry):
        self.shards[name] = entry
        self.save()

    def save(self, complete=False, report=None):
        self.complete = complete
        if report is not None:
            self.report = report
        write_json_atomically(self.path, {
            "kind": self.kind,
            "fingerprint": self.fingerprint,
            "complete": complete,
            "shards": self.shards,
            "report": self.report,
        })


@contextlib.contextmanager
def stopping_cleanly(manifest):
    """A run writing into `manifest`'s directory that stops early (Ctrl-C,
    SIGTERM, a full disk) says in one line what it keeps and how to go on;
    a directory it made and left empty goes."""
    again = "run the same command again to continue"
    try:
        yield
    except KeyboardInterrupt:
        raise Interrupted(f"interrupted; {manifest.kept()}; {again}") from None
    except WriteFailed as error:
        raise UserError(f"{error}; {manifest.kept()}; {again}") from None
    finally:
        manifest.discard_if_unused()
