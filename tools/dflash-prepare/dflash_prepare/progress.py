"""The manifest of an output directory: which shards are complete, for which
run, so that an interrupted run continues where it stopped.

`manifest.json` is rewritten atomically after every shard. A run whose
fingerprint (inputs, options, tokenizer or target, spec) matches keeps the
shards it lists; a different run refuses the directory unless told to
overwrite it.
"""
import hashlib
import json
import os

from .errors import UserError, note
from .shards import remove_stale_temps, write_json_atomically

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
    with open(path, "rb") as f:
        while True:
            chunk = f.read(1 << 20)
            if not chunk:
                break
            digest.update(chunk)
    return digest.hexdigest()


class Manifest:
    def __init__(self, directory, kind, print_fingerprint, overwrite):
        """Opens `directory` for a run of `kind` ("tokens" or "features")
        with `print_fingerprint` and decides what is kept."""
        self.directory = directory
        self.path = os.path.join(directory, MANIFEST)
        self.kind = kind
        self.fingerprint = print_fingerprint
        # The folders this run makes, deepest first: discard_if_unused
        # removes them again where nothing was written.
        self.made = []
        parent = os.path.abspath(directory)
        while not os.path.exists(parent):
            self.made.append(parent)
            parent = os.path.dirname(parent)
        try:
            os.makedirs(directory, exist_ok=True)
        except OSError as error:
            raise UserError(f"{directory}: cannot create the output directory: "
                            f"{error.strerror}") from None
        removed = remove_stale_temps(directory)
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
            except (OSError, ValueError):
                raise UserError(f"{self.path}: unreadable manifest; remove the "
                                "directory or pick another") from None
        existing = sorted(n for n in os.listdir(directory) if n.endswith(".safetensors"))
        same = (old is not None and old.get("kind") == kind and
                old.get("fingerprint") == print_fingerprint)
        self.shards = {}
        self.complete = False
        self.report = {}
        if same:
            for name, entry in (old.get("shards") or {}).items():
                path = os.path.join(directory, name)
                if entry.get("empty") or (os.path.isfile(path) and
                                          os.path.getsize(path) == entry.get("bytes")):
                    self.shards[name] = entry
            self.complete = bool(old.get("complete")) and \
                len(self.shards) == len(old.get("shards") or {})
            self.report = old.get("report") or {}
            stray = [n for n in existing if n not in self.shards]
            for name in stray:
                os.remove(os.path.join(directory, name))
        elif old is not None or existing:
            if not overwrite:
                why = ("holds the shards of a different run (its manifest.json "
                       "does not match these inputs and options)" if old is not None
                       else "already holds *.safetensors files but no manifest.json")
                raise UserError(f"{directory}: {why}; use an empty directory, or "
                                "--overwrite to replace them")
            for name in existing:
                os.remove(os.path.join(directory, name))
            if old is not None:
                os.remove(self.path)
            note(f"{directory}: removed {len(existing)} shard(s) of an earlier run (--overwrite)")

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
