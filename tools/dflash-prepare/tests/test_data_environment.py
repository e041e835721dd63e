"""The data environment (scripts/setup.sh --data): its one-line refusal where
no package index answers, the launchers running in it, the messages that
name the interpreter, and, where this python can make a virtual environment
with pip, the whole install from a local index of stand-in wheels."""
import base64
import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
import unittest
import zipfile

from helpers import PLOT, PREPARE, ROOT, TempDir, run_tool

from dflash_prepare.errors import UserError, require

SETUP = os.path.join(ROOT, "scripts", "setup.sh")
UNREACHABLE = "http://127.0.0.1:9/simple"  # the discard port: nothing answers


def clean_env(**extra):
    """This environment without pip's settings (PIP_*, pip.conf), so that
    only what a test sets is in force."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("PIP_") and k not in ("DFLASH_DATA_VENV", "DFLASH_PYTHON")}
    env.update(PIP_CONFIG_FILE=os.devnull, DFLASH_PYTHON=sys.executable, **extra)
    return env


def setup_data(env):
    result = subprocess.run(["bash", SETUP, "--data"], capture_output=True, text=True,
                            env=env, timeout=900)
    return result.returncode, result.stdout, result.stderr


def can_make_venv_with_pip():
    return importlib.util.find_spec("ensurepip") is not None


@unittest.skipUnless(os.path.isfile(SETUP), "needs the checkout's scripts/setup.sh")
class RefusalTest(TempDir):
    def test_no_index_reachable_is_one_line_and_changes_nothing(self):
        venv = self.path("venv")
        status, out, err = setup_data(clean_env(PIP_INDEX_URL=UNREACHABLE,
                                                DFLASH_DATA_VENV=venv))
        self.assertEqual(status, 1, err)
        self.assertEqual(out, "")
        self.assertEqual(len(err.splitlines()), 1, err)
        self.assertTrue(err.startswith(f"setup: error: no package index reachable "
                                       f"({UNREACHABLE}: "), err)
        # What is missing is named: every requirement of tools/pyproject.toml.
        for package in ("numpy", "transformers", "tokenizers", "torch >= 2", "safetensors",
                        "jinja2", "matplotlib", "dflash-data-tools"):
            self.assertIn(package, err)
        self.assertIn(f"into {venv};", err)
        self.assertFalse(os.path.exists(venv))

    def test_pip_configuration_is_respected(self):
        # An index named in a pip.conf, and a find-links folder without the package.
        config = self.write_file("pip.conf", f"[global]\nindex-url = {UNREACHABLE}\n"
                                             f"find-links = {self.dir}\n")
        env = clean_env(DFLASH_DATA_VENV=self.path("venv"))
        env["PIP_CONFIG_FILE"] = config
        status, _, err = setup_data(env)
        self.assertEqual(status, 1, err)
        self.assertIn(f"({UNREACHABLE}: ", err)
        self.assertIn(f"{self.dir}: no numpy in it", err)
        status, _, err = setup_data(clean_env(PIP_NO_INDEX="1",
                                              DFLASH_DATA_VENV=self.path("venv")))
        self.assertEqual(status, 1, err)
        self.assertIn("(PIP_NO_INDEX and no find-links)", err)

    def test_an_unknown_argument_is_refused(self):
        result = subprocess.run(["bash", SETUP, "--dta"], capture_output=True, text=True)
        self.assertEqual(result.returncode, 2)
        self.assertIn("unknown argument '--dta'", result.stderr)

    def test_help_names_both_forms_and_installs_nothing(self):
        result = subprocess.run(["bash", SETUP, "--help"], capture_output=True, text=True)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn("scripts/setup.sh --data", result.stdout)
        self.assertNotIn("installing", result.stdout + result.stderr)


def fake_venv(directory, log):
    """A folder shaped like a virtual environment whose bin/python notes its
    arguments in `log`, then runs this python."""
    os.makedirs(os.path.join(directory, "bin"))
    python = os.path.join(directory, "bin", "python")
    with open(python, "w") as f:
        f.write(f'#!/bin/sh\necho "$@" >> {log}\nexec {sys.executable} "$@"\n')
    os.chmod(python, 0o755)
    return directory


class LauncherTest(TempDir):
    def test_the_launchers_run_in_the_data_environment(self):
        log = self.path("log")
        venv = fake_venv(self.path("venv"), log)
        for tool in (PREPARE, PLOT):
            status, out, err = run_tool(tool, "--help", env={"DFLASH_DATA_VENV": venv})
            self.assertEqual(status, 0, err)
            self.assertIn("usage:", out)
        with open(log) as f:
            self.assertEqual(f.read().splitlines(), [f"{PREPARE} --help", f"{PLOT} --help"])
        # Not where it is turned off or has no python; and once only (the
        # stand-in is not a real venv: its python would run the launcher again).
        os.remove(log)
        status, _, _ = run_tool(PREPARE, "--help", env={"DFLASH_DATA_VENV": "none"})
        os.makedirs(self.path("empty"))
        status, _, _ = run_tool(PREPARE, "--help", env={"DFLASH_DATA_VENV": self.path("empty")})
        self.assertEqual(status, 0)
        self.assertFalse(os.path.exists(log))

    def test_the_checkout_s_venv_is_the_default(self):
        # A copy of the launcher and its package in a checkout-shaped folder.
        tool = self.path("root", "tools", "dflash-prepare")
        shutil.copytree(os.path.dirname(PREPARE), tool,
                        ignore=shutil.ignore_patterns("tests", "__pycache__"))
        log = self.path("log")
        fake_venv(self.path("root", ".venv-data"), log)
        env = {k: v for k, v in os.environ.items() if k != "DFLASH_DATA_VENV"}
        result = subprocess.run([sys.executable, os.path.join(tool, "dflash-prepare"), "--help"],
                                capture_output=True, text=True, env=env)
        self.assertEqual(result.returncode, 0, result.stderr)
        with open(log) as f:
            self.assertEqual(f.read().split()[1:], ["--help"])

    def test_a_missing_numpy_names_the_venv_s_python(self):
        # A real venv without numpy: the launcher runs in it and says so.
        venv = self.path("bare")
        made = subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv],
                              capture_output=True, text=True)
        if made.returncode != 0:
            self.skipTest(f"python -m venv fails here: {made.stderr.strip()}")
        status, _, err = run_tool(PREPARE, "--help", env={"DFLASH_DATA_VENV": venv})
        python = os.path.join(venv, "bin", "python")
        self.assertEqual(status, 2, err)
        self.assertEqual(err, f"dflash-prepare: error: the python package 'numpy' is missing "
                         f"from {python}; every command needs it: run {ROOT}/scripts/setup.sh "
                         "--data (a virtual environment with every package of the data tools, "
                         f"which the launchers then use), or {python} -m pip install numpy\n")


class MessageTest(unittest.TestCase):
    def test_a_missing_package_names_this_python_and_the_commands(self):
        with self.assertRaises(UserError) as caught:
            require("no_such_package_dflash.part", "the test")
        message = str(caught.exception)
        self.assertIn(f"the python package 'no_such_package_dflash' is missing or broken in "
                      f"{sys.executable} (", message)
        self.assertIn(f"the test needs it: run {ROOT}/scripts/setup.sh --data", message)
        managed = sys.prefix == sys.base_prefix and os.path.exists(os.path.join(
            __import__("sysconfig").get_path("stdlib"), "EXTERNALLY-MANAGED"))
        # pip into this python, except where pip may not (Debian's own).
        self.assertEqual(f"{sys.executable} -m pip install no_such_package_dflash" in message,
                         not managed)


def write_wheel(directory, name, version, files, entry_points=None):
    """A wheel of `files` ({path in the wheel: text}) with its metadata."""
    dist = f"{name.replace('-', '_')}-{version}"
    contents = dict(files)
    contents[f"{dist}.dist-info/METADATA"] = (f"Metadata-Version: 2.1\nName: {name}\n"
                                              f"Version: {version}\n")
    contents[f"{dist}.dist-info/WHEEL"] = ("Wheel-Version: 1.0\nGenerator: test\n"
                                           "Root-Is-Purelib: true\nTag: py3-none-any\n")
    if entry_points:
        contents[f"{dist}.dist-info/entry_points.txt"] = entry_points
    record = []
    for path, text in contents.items():
        data = text if isinstance(text, bytes) else text.encode()
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(data)}")
    record.append(f"{dist}.dist-info/RECORD,,")
    contents[f"{dist}.dist-info/RECORD"] = "\n".join(record) + "\n"
    path = os.path.join(directory, f"{dist}-py3-none-any.whl")
    with zipfile.ZipFile(path, "w") as wheel:
        for name_in, text in contents.items():
            wheel.writestr(name_in, text)
    return path


def installed_wheel_package():
    """The `wheel` package this python has, as files for a wheel of it
    (setuptools builds tools/ with it)."""
    try:
        import wheel
    except ImportError:
        return None
    folder = os.path.dirname(wheel.__file__)
    files = {}
    for base, _, names in os.walk(folder):
        for name in names:
            if name.endswith(".py"):
                path = os.path.join(base, name)
                with open(path, "rb") as f:
                    files[os.path.relpath(path, os.path.dirname(folder))] = f.read()
    return wheel.__version__, files


@unittest.skipUnless(os.path.isfile(SETUP), "needs the checkout's scripts/setup.sh")
class InstallTest(TempDir):
    """setup.sh --data end to end, from a file:// index of stand-ins."""

    def test_install_from_a_local_index(self):
        setuptools_wheel = sorted(f for f in os.listdir("/usr/share/python-wheels")
                                  if f.startswith("setuptools-")) \
            if os.path.isdir("/usr/share/python-wheels") else []
        wheel_package = installed_wheel_package()
        if not (can_make_venv_with_pip() and setuptools_wheel and wheel_package):
            self.skipTest("needs ensurepip (Debian: python3-venv), a setuptools wheel "
                          "(python3-setuptools-whl) and the wheel package (python3-wheel)")
        simple = self.path("simple")
        wheels = self.path("wheels")
        os.makedirs(wheels)
        log = self.path("imported")
        stand_in = (f"import os\nopen({log!r}, 'a').write(__name__ + ' ' + __file__ + "
                    "'\\n')\n__version__ = '{version}'\n")
        for name, version in (("numpy", "1.99"), ("transformers", "9.0"), ("tokenizers", "9.0"),
                              ("jinja2", "9.0"), ("torch", "2.99"), ("safetensors", "9.0"),
                              ("matplotlib", "9.0")):
            write_wheel(wheels, name, version,
                        {f"{name}/__init__.py": stand_in.format(version=version)})
        version, files = wheel_package
        write_wheel(wheels, "wheel", version, files, entry_points=(
            "[distutils.commands]\nbdist_wheel = wheel.bdist_wheel:bdist_wheel\n"))
        shutil.copy(os.path.join("/usr/share/python-wheels", setuptools_wheel[-1]), wheels)
        for file in os.listdir(wheels):
            project = file.split("-")[0].replace("_", "-").lower()
            os.makedirs(os.path.join(simple, project), exist_ok=True)
            shutil.copy(os.path.join(wheels, file), os.path.join(simple, project))
            with open(os.path.join(simple, project, "index.html"), "w") as f:
                f.write(f'<html><body><a href="{file}">{file}</a></body></html>\n')
        venv = self.path("venv")
        # pip's editable install leaves its egg-info in tools/ (ignored by git).
        egg_info = os.path.join(ROOT, "tools", "dflash_data_tools.egg-info")
        if not os.path.exists(egg_info):
            self.addCleanup(shutil.rmtree, egg_info, True)
        env = clean_env(PIP_INDEX_URL=f"file://{simple}", DFLASH_DATA_VENV=venv)
        status, out, err = setup_data(env)
        self.assertEqual(status, 0, out + err)
        self.assertIn(f"setup: the data environment is {venv}", out)
        python = os.path.join(venv, "bin", "python")
        torch = subprocess.run([python, "-c", "import torch; print(torch.__version__)"],
                               capture_output=True, text=True)
        self.assertEqual(torch.stdout, "2.99\n")
        # The launcher runs in it: its numpy is the stand-in.
        os.remove(log)
        status, out, err = run_tool(PREPARE, "--help", env={"DFLASH_DATA_VENV": venv})
        self.assertEqual(status, 0, err)
        with open(log) as f:
            self.assertIn(f"numpy {venv}/", f.read())
        # Again: nothing to do, and no index asked.
        env["PIP_INDEX_URL"] = UNREACHABLE
        status, out, err = setup_data(env)
        self.assertEqual((status, err), (0, ""))
        self.assertEqual(out, f"setup: the data environment {venv} has every package already\n")


if __name__ == "__main__":
    unittest.main()
