"""The data tools' Python environment, for `scripts/setup.sh --data`.

  data_environment.py plan VENV     what VENV lacks, and whether an index can give it
  data_environment.py missing       (run by VENV's python) the requirements it lacks
  data_environment.py verify VENV   after pip: VENV has every requirement

The requirements are tools/pyproject.toml's: its dependencies and the extras
EXTRAS, and the distribution itself. `plan` exits 0 where they are to be
installed, 10 where VENV has them all already, and 1 with one line on stderr
where no package index pip would use (PIP_INDEX_URL, PIP_EXTRA_INDEX_URL,
PIP_FIND_LINKS, PIP_NO_INDEX, pip's configuration files) answers within
TIMEOUT seconds. Only the standard library: it runs before anything is
installed."""
import configparser
import json
import os
import re
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PYPROJECT = os.path.join(ROOT, "tools", "pyproject.toml")
EXTRAS = ("tokens", "features", "plot")
TIMEOUT = 5.0
PROG = "setup"


def requirements():
    """(the distribution's name, its requirements with EXTRAS, in order)."""
    try:
        import tomllib
    except ImportError:
        sys.exit(f"{PROG}: error: the data tools need python >= 3.11; {sys.executable} is "
                 f"{sys.version.split()[0]} (DFLASH_PYTHON names another)")
    with open(PYPROJECT, "rb") as f:
        project = tomllib.load(f)["project"]
    found = []
    for requirement in project["dependencies"] + [
            r for extra in EXTRAS for r in project["optional-dependencies"][extra]]:
        if requirement not in found:
            found.append(requirement)
    return project["name"], found


def _version(text):
    return tuple(int(part) for part in re.findall(r"\d+", text)[:3])


def satisfied(requirement):
    """Whether this python has `requirement` ("name" or "name >= version")."""
    from importlib import metadata
    match = re.fullmatch(r"\s*([A-Za-z0-9_.-]+)\s*(?:>=\s*([0-9][0-9.]*))?\s*", requirement)
    name, least = (match.group(1), match.group(2)) if match else (requirement, None)
    try:
        version = metadata.version(name)
    except metadata.PackageNotFoundError:
        return False
    return least is None or _version(version) >= _version(least)


def missing_here():
    name, needed = requirements()
    return [r for r in needed + [name] if not satisfied(r)]


def missing_in(venv):
    """What VENV lacks: everything where it has no python yet."""
    python = os.path.join(venv, "bin", "python")
    if not os.access(python, os.X_OK):
        name, needed = requirements()
        return needed + [name]
    result = subprocess.run([python, os.path.abspath(__file__), "missing"],
                            capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"{PROG}: error: {python} cannot say what it has: "
                 f"{result.stderr.strip() or result.returncode}")
    return json.loads(result.stdout)


def _truth(text):
    return str(text).strip().lower() in ("1", "true", "yes", "on")


def pip_sources():
    """(index URLs, find-links, no_index) as pip install would take them:
    its configuration files in pip's order ([global], then [install]), then
    the PIP_* variables over them."""
    settings = {}
    chosen = os.environ.get("PIP_CONFIG_FILE")
    files = []
    if chosen != os.devnull:
        config = os.environ.get("XDG_CONFIG_HOME") or os.path.expanduser("~/.config")
        dirs = os.environ.get("XDG_CONFIG_DIRS") or "/etc/xdg"
        files = ([os.path.join(d, "pip", "pip.conf") for d in dirs.split(":")]
                 + ["/etc/pip.conf", os.path.expanduser("~/.pip/pip.conf"),
                    os.path.join(config, "pip", "pip.conf")]
                 + ([chosen] if chosen else []))
    for path in files:
        parser = configparser.RawConfigParser()
        try:
            parser.read(path)
        except configparser.Error:
            continue
        for section in ("global", "install"):
            if parser.has_section(section):
                for key, value in parser.items(section):
                    settings[key.replace("_", "-")] = value
    for key in ("index-url", "extra-index-url", "find-links", "no-index"):
        variable = "PIP_" + key.upper().replace("-", "_")
        if variable in os.environ:
            settings[key] = os.environ[variable]
    no_index = _truth(settings.get("no-index", "false"))
    indexes = [] if no_index else (
        [settings.get("index-url", "https://pypi.org/simple")]
        + settings.get("extra-index-url", "").split())
    return indexes, settings.get("find-links", "").split(), no_index


def _normal(name):
    return re.sub(r"[-_.]+", "-", name).lower()


def reachable(url, project, index=True):
    """None where `url` can give `project`, else why not: an index (any
    HTTP answer to its page of `project` counts; a file:// one must have
    that page), or a find-links folder (it must hold a file of `project`)."""
    parsed = urllib.parse.urlparse(url)
    if parsed.scheme in ("", "file"):
        path = urllib.request.url2pathname(parsed.path) if parsed.scheme else url
        if not os.path.isdir(path):
            return "no such folder"
        if index:
            names = [n for n in os.listdir(path) if _normal(n) == _normal(project)]
            return None if names else f"no {project} in it"
        for name in os.listdir(path):
            found = re.match(r"(.+?)-\d", name)
            if found and _normal(found.group(1)) == _normal(project):
                return None
        return f"no {project} in it"
    page = url.rstrip("/") + "/" + (project + "/" if index else "")
    try:
        with urllib.request.urlopen(page, timeout=TIMEOUT) as answer:
            answer.read(1)
        return None
    except urllib.error.HTTPError:
        return None  # it answered
    except (urllib.error.URLError, OSError, ValueError) as error:
        reason = getattr(error, "reason", error)
        return str(reason) or type(reason).__name__


def plan(venv):
    missing = missing_in(venv)
    if not missing:
        print(f"{PROG}: the data environment {venv} has every package already")
        return 10
    indexes, links, no_index = pip_sources()
    project = re.match(r"[A-Za-z0-9_.-]+", missing[0]).group()
    tried = []
    for url in indexes:
        why = reachable(url, project)
        if why is None:
            return 0
        tried.append(f"{url}: {why}")
    for link in links:
        why = reachable(link, project, index=False)
        if why is None:
            return 0
        tried.append(f"{link}: {why}")
    where = "; ".join(tried) if tried else "PIP_NO_INDEX and no find-links"
    print(f"{PROG}: error: no package index reachable ({where}): cannot install "
          f"{', '.join(missing)} into {venv}; set PIP_INDEX_URL to an index this machine "
          "reaches (or PIP_FIND_LINKS to a folder of wheels)", file=sys.stderr)
    return 1


def verify(venv):
    missing = missing_in(venv)
    if missing:
        print(f"{PROG}: error: {venv} still lacks {', '.join(missing)} after pip "
              "(see above)", file=sys.stderr)
        return 1
    return 0


def main(argv):
    if len(argv) == 2 and argv[1] == "missing":
        print(json.dumps(missing_here()))
        return 0
    if len(argv) == 3 and argv[1] in ("plan", "verify"):
        return (plan if argv[1] == "plan" else verify)(os.path.abspath(argv[2]))
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
