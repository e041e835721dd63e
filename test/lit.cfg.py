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
config.excludes = ["CMakeLists.txt", "lit.cfg.py", "lit.site.cfg.py", "unit", "gpu", "oracle", "Inputs", "compile-spec.sh"]
config.test_source_root = os.path.dirname(__file__)
config.test_exec_root = os.path.join(config.dflash_obj_root, "test")

config.substitutions.append(("%specs", os.path.join(config.dflash_src_root, "specs")))
config.substitutions.append(("%src", config.dflash_src_root))

llvm_config.use_default_substitutions()
llvm_config.with_environment("PATH", config.llvm_tools_dir, append_path=True)
llvm_config.with_environment("PATH", config.dflash_tools_dir, append_path=True)
llvm_config.add_tool_substitutions(
    ["dflashc", "dflash-opt", "dflash-reference", "dflash-synth"],
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
