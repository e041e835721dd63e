#!/usr/bin/env python3
"""Fails on a reference to a Markdown document that the repository lacks.

Usage: scripts/check-doc-references.py [ROOT]

ROOT (default: this checkout) is the repository to check. When ROOT is the
top of a git work tree, the files are those `git ls-files` lists and present
on disk; otherwise every file under ROOT, leaving out `.git/`, `.device/` and
folders whose name starts with `build`. Files that are not UTF-8 text are
skipped. In Python sources (`*.py`, and files whose first line is a python
shebang) only comments and strings are read, so that an attribute named md
(`report.md` where `report` is an object) is not taken for a file name.

A reference is a file name ending in `.md`, with or without folders in
front: `docs/semantics.md`, `bench/RESULTS.md`, `../docs/data.md`, `NOTES.md`,
and the target of a Markdown link, `[runtime](runtime.md#resume)`. Text that
belongs to a URL (`https://host/x.md`) or to a placeholder (`$OUT/x.md`,
`%t/x.md`) is not a reference.

How a reference resolves (paths are case-sensitive):
1. With a folder part (`docs/data.md`, `../docs/data.md`): against the
   citing file's folder, then against the repository root.
2. A bare file name (`NOTES.md`): against the citing file's folder, then the
   root; failing both, it names the one file of the repository with that
   name, wherever it is. A name that several files share (`README.md`), or
   that no file has, must resolve by the first two.
3. An absolute path, or one that leaves the repository (a `../shared/`
   path cited from the root), never resolves: the repository stands on its
   own documents.

Two exceptions, both listed below: files that programs write when they run
(OUTPUT_NAMES, named in the tools' help and docs), and the checker's own
tests (SKIPPED), which cite missing documents on purpose.

Each reference that does not resolve is one line on stdout,
`FILE:LINE: error: missing document 'REF'`; then a summary on stderr.
Exit status: 0 every reference resolves, 1 one does not, 2 bad usage.
"""

import io
import os
import posixpath
import re
import subprocess
import sys
import tokenize

PROGRAM = "check-doc-references"

# Tokens that hold a Python source's text (f-strings split into pieces from
# Python 3.12 on).
TEXT_TOKENS = {tokenize.COMMENT, tokenize.STRING,
               getattr(tokenize, "FSTRING_MIDDLE", tokenize.STRING)}

# File names that programs of the repository write, not documents in it.
OUTPUT_NAMES = {
    "report.md",  # scripts/device/device-check's report, written under $OUT
}

# Folders (relative to ROOT) whose files are neither read nor cited.
SKIPPED = ("test/Docs/",)

# A path ending in .md: optional leading "/", folders, then the file name. It
# may not start inside a longer path, a URL or a placeholder.
REFERENCE = re.compile(
    r"(?<![\w./:$%~-])(/?(?:[\w.-]+/)*[\w-][\w.-]*\.md)(?![\w-])")


def git_files(root):
    """The tracked files that are present, or None when ROOT is not the top
    of a git work tree."""
    def git(*args):
        return subprocess.run(["git", "-C", root, *args],
                              capture_output=True, text=True)

    try:
        top = git("rev-parse", "--show-toplevel")
        if top.returncode != 0:
            return None
        if os.path.realpath(top.stdout.strip()) != os.path.realpath(root):
            return None
        listing = git("ls-files", "-z")
    except OSError:
        return None
    if listing.returncode != 0:
        return None
    names = [name for name in listing.stdout.split("\0") if name]
    return [name for name in names
            if os.path.isfile(os.path.join(root, name))]


def walked_files(root):
    """Every file under ROOT but .git/, .device/ and build*/ folders."""
    files = []
    for folder, subfolders, names in os.walk(root):
        subfolders[:] = sorted(
            name for name in subfolders
            if name not in (".git", ".device")
            and not name.startswith("build"))
        for name in sorted(names):
            path = os.path.relpath(os.path.join(folder, name), root)
            files.append(path.replace(os.sep, "/"))
    return files


def read_text(path):
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return None
    if b"\0" in data:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def is_python(name, text):
    if name.endswith(".py"):
        return True
    first = text.split("\n", 1)[0]
    return first.startswith("#!") and "python" in first


def python_text_lines(text):
    """(line number, text) of every comment and string of a Python source;
    the whole text where it does not tokenize."""
    pieces = []
    try:
        for token in tokenize.generate_tokens(io.StringIO(text).readline):
            if token.type in TEXT_TOKENS:
                for offset, line in enumerate(token.string.split("\n")):
                    pieces.append((token.start[0] + offset, line))
    except (tokenize.TokenError, SyntaxError, IndentationError):
        return list(enumerate(text.splitlines(), 1))
    return pieces


def resolve(reference, citing, present, names):
    """True when REFERENCE, cited in the file CITING, names a file of the
    repository (the rules of the module's docstring)."""
    if reference.startswith("/"):
        return False
    for base in (posixpath.dirname(citing), ""):
        candidate = posixpath.normpath(posixpath.join(base, reference))
        if not candidate.startswith("../") and candidate in present:
            return True
    if "/" not in reference:
        return len(names.get(reference, ())) == 1
    return False


def check(root):
    """(problems, references) of the repository at ROOT."""
    files = git_files(root)
    if files is None:
        files = walked_files(root)
    files = [name for name in files
             if not any(name.startswith(prefix) for prefix in SKIPPED)]
    present = set(files)
    names = {}
    for name in files:
        names.setdefault(posixpath.basename(name), []).append(name)
    problems = []
    count = 0
    for name in files:
        text = read_text(os.path.join(root, name))
        if text is None:
            continue
        if is_python(name, text):
            lines = python_text_lines(text)
        else:
            lines = enumerate(text.splitlines(), 1)
        for number, line in lines:
            for match in REFERENCE.finditer(line):
                reference = match.group(1)
                if posixpath.basename(reference) in OUTPUT_NAMES:
                    continue
                count += 1
                if not resolve(reference, name, present, names):
                    problems.append((name, number, reference))
    return problems, count


def main(argv):
    if len(argv) > 1 or (argv and argv[0].startswith("-")):
        if argv and argv[0] in ("-h", "--help"):
            print(__doc__.strip())
            return 0
        print(f"usage: {PROGRAM}.py [ROOT]", file=sys.stderr)
        return 2
    here = os.path.dirname(os.path.abspath(__file__))
    root = argv[0] if argv else os.path.dirname(here)
    if not os.path.isdir(root):
        print(f"{PROGRAM}: error: {root}: not a directory", file=sys.stderr)
        return 2
    problems, count = check(root)
    for name, number, reference in problems:
        print(f"{name}:{number}: error: missing document '{reference}'")
    sys.stdout.flush()
    if problems:
        files = len({name for name, _, _ in problems})
        print(f"{PROGRAM}: {len(problems)} of {count} references name no "
              f"document of the repository ({files} files)", file=sys.stderr)
        return 1
    print(f"{PROGRAM}: {count} references, every document present",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
