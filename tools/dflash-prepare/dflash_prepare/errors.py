"""Errors that end a command with a message instead of a traceback."""
import importlib
import sys

PROG = "dflash-prepare"


class UserError(Exception):
    """Bad usage or input: the message names the file, line or field.
    Exits with status 2."""

    exit_code = 2
    bare = False  # True: the message is printed as it is (a spec's FILE:LINE:COL)

    def report(self, prog=PROG):
        """The line a command prints for it."""
        return str(self) if self.bare else f"{prog}: error: {self}"


class CheckFailed(Exception):
    """A check found problems (already reported). Exits with status 1."""

    exit_code = 1


# Import name -> the name a user installs (pip or Debian).
_INSTALL_HINTS = {
    "numpy": "numpy (Debian: python3-numpy)",
    "torch": "torch (PyTorch 2.x)",
    "transformers": "transformers",
    "tokenizers": "tokenizers",
    "jinja2": "jinja2",
    "matplotlib": "matplotlib (Debian: python3-matplotlib)",
}


def require(module, why):
    """Imports `module` or raises UserError saying which package is missing
    and what needs it."""
    try:
        return importlib.import_module(module)
    except ImportError as error:
        top = module.split(".")[0]
        hint = _INSTALL_HINTS.get(top, top)
        detail = str(error)
        raise UserError(
            f"the python package '{top}' is missing or broken ({detail}); "
            f"{why} needs it: install {hint}") from None


def require_torch2(why):
    torch = require("torch", why)
    major = int(torch.__version__.split(".")[0])
    if major < 2:
        raise UserError(
            f"torch {torch.__version__} is too old; {why} needs torch >= 2")
    return torch


def warn(message):
    print(f"{PROG}: warning: {message}", file=sys.stderr)


def note(message):
    print(f"{PROG}: {message}", file=sys.stderr)
