"""Errors that end a command with a message instead of a traceback."""
import importlib
import os
import shlex
import sys
import sysconfig

PROG = "dflash-prepare"


class UserError(Exception):
    """Bad usage or input: the message names the file, line or field.
    Exits with status 2."""

    exit_code = 2
    bare = False  # True: the message is printed as it is (a spec's FILE:LINE:COL)

    def report(self, prog=PROG):
        """The line a command prints for it."""
        return str(self) if self.bare else f"{prog}: error: {self}"


class Interrupted(UserError):
    """Ctrl-C or SIGTERM during a run: the message says what was kept and
    how to go on. Exits with status 130, as a shell reports SIGINT."""

    exit_code = 130

    def report(self, prog=PROG):
        return f"{prog}: {self}"


class CheckFailed(Exception):
    """A check found problems (already reported). Exits with status 1."""

    exit_code = 1


# Import name -> what pip installs (tools/pyproject.toml's requirement), and
# Debian's package where Debian's will do.
_PIP = {"torch": "torch>=2"}
_DEBIAN = {"numpy": "python3-numpy", "jinja2": "python3-jinja2",
           "matplotlib": "python3-matplotlib"}
# The checkout this package sits in (tools/dflash-prepare/dflash_prepare).
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))


def _externally_managed():
    """Whether pip refuses to install into this python (Debian's own,
    outside a virtual environment: PEP 668)."""
    return sys.prefix == sys.base_prefix and os.path.exists(
        os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED"))


def install_hint(module):
    """The commands that install `module`'s package for this python: the
    checkout's data environment, and pip into this very interpreter (or
    Debian's package, where pip may not install into it)."""
    top = module.split(".")[0]
    ways = []
    setup = os.path.join(_ROOT, "scripts", "setup.sh")
    if os.path.isfile(setup) and os.path.isfile(os.path.join(_ROOT, "tools", "pyproject.toml")):
        ways.append(f"{shlex.quote(setup)} --data (a virtual environment with every "
                    "package of the data tools, which the launchers then use)")
    if not _externally_managed():
        ways.append(f"{shlex.quote(sys.executable)} -m pip install "
                    f"{shlex.quote(_PIP.get(top, top))}")
    elif top in _DEBIAN:
        ways.append(f"apt-get install {_DEBIAN[top]}")
    if not ways:
        ways.append(f"python3 -m venv DIR && DIR/bin/pip install {shlex.quote(_PIP.get(top, top))}"
                    ", then run the tools with DIR/bin/python")
    return "run " + ", or ".join(ways)


def require(module, why):
    """Imports `module` or raises UserError saying which package is missing
    from which python, what needs it and how to install it."""
    try:
        return importlib.import_module(module)
    except ImportError as error:
        top = module.split(".")[0]
        raise UserError(
            f"the python package '{top}' is missing or broken in {sys.executable} ({error}); "
            f"{why} needs it: {install_hint(top)}") from None


def require_torch2(why):
    torch = require("torch", why)
    major = int(torch.__version__.split(".")[0])
    if major < 2:
        raise UserError(
            f"torch {torch.__version__} in {sys.executable} is too old; {why} needs "
            f"torch >= 2: {install_hint('torch')}")
    return torch


def warn(message):
    print(f"{PROG}: warning: {message}", file=sys.stderr)


def note(message):
    print(f"{PROG}: {message}", file=sys.stderr)
