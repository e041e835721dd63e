"""scripts/device-prepare.sh against scripts/device/products.toml, on a CPU
machine with stand-ins for cmake, ninja, nvcc, dflashc and the tools: every
item the products file declares is built by device-prepare and leaves the
files it says, and the derived specs are valid TOML with the keys their
names promise. Nothing is compiled.

  /usr/bin/python3 -m unittest discover -s scripts/device/tests
"""

import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import tomllib
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
DEVICE = os.path.dirname(HERE)
REPO = os.path.dirname(os.path.dirname(DEVICE))
sys.path.insert(0, DEVICE)

import suites  # noqa: E402

# The emitted project's manifest carries the spec it was given and its
# flags, so the test can read what device-prepare derived.
FAKE_DFLASHC = f"""#!{sys.executable}
import json, os, sys
args = sys.argv[1:]
out = args[args.index("-o") + 1]
os.makedirs(out, exist_ok=True)
spec = open(args[0]).read()
target = args[args.index("--target") + 1] if "--target" in args else None
json.dump({{"spec": spec, "target": target, "args": args[1:]}},
          open(os.path.join(out, "manifest.json"), "w"))
"""
FAKE_NINJA = """#!/bin/sh
# ninja -C DIR: a trainer project's build folder gets its two binaries.
case $2 in */build) mkdir -p "$2" && touch "$2/train" "$2/target-features" ;; esac
"""
FAKE_NVCC = """#!/bin/sh
while [ $# -gt 0 ]; do [ "$1" = -o ] && touch "$2"; shift; done
"""
FAKE_SYNTH = """#!/bin/sh
mkdir -p "$2/target" "$2/data" "$2/init"
touch "$2/target/config.json" "$2/init/model.safetensors" "$2/data/shard-00000.safetensors"
"""
FAKE_REFERENCE = """#!/bin/sh
while [ $# -gt 0 ]; do
  [ "$1" = --save ] && mkdir -p "$2" && touch "$2/model.safetensors"
  shift
done
echo '{"step": 0, "loss": 1.0}'
"""
FAKE_TARGET_FEATURES = """#!/bin/sh
while [ $# -gt 0 ]; do [ "$1" = -o ] && touch "$2"; shift; done
"""
# pack_rows.py IN OUT 40 90 and target_oracle.py make KIND DIR.
FAKE_PYTHON = """#!/bin/sh
case $1 in
  *pack_rows.py) mkdir -p "$3" ;;
  *target_oracle.py) mkdir -p "$4" && touch "$4/tokens.safetensors" ;;
esac
"""


def executable(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, os.stat(path).st_mode | stat.S_IEXEC)


class DevicePrepareTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.root = tempfile.mkdtemp()
        root = cls.root
        os.makedirs(os.path.join(root, "scripts"))
        shutil.copy(os.path.join(REPO, "scripts", "device-prepare.sh"), os.path.join(root, "scripts"))
        for name in os.listdir(os.path.join(REPO, "scripts")):  # specs of demos
            if name.endswith(".toml"):
                shutil.copy(os.path.join(REPO, "scripts", name), os.path.join(root, "scripts"))
        shutil.copytree(os.path.join(REPO, "scripts", "target-configs"),
                        os.path.join(root, "scripts", "target-configs"))
        shutil.copytree(os.path.join(REPO, "specs"), os.path.join(root, "specs"))
        os.makedirs(os.path.join(root, "build-dev", "test", "gpu"))
        open(os.path.join(root, "build-dev", "build.ninja"), "w").close()
        cls.products = suites.Products()
        # A stand-in for each GPU test the products file names.
        for name in cls.products.kinds["test"]["names"]:
            executable(os.path.join(root, "build-dev", "test", "gpu", name), "#!/bin/sh\n")
        executable(os.path.join(root, "build-dev", "bin", "dflash-synth"), FAKE_SYNTH)
        executable(os.path.join(root, "build-dev", "bin", "dflash-reference"), FAKE_REFERENCE)
        executable(os.path.join(root, "build-dev", "bin", "dflash-target-features"), FAKE_TARGET_FEATURES)
        executable(os.path.join(root, "build-dev", "bin", "dflashc"), FAKE_DFLASHC)
        tools = os.path.join(root, "fake-tools")
        executable(os.path.join(tools, "ninja"), FAKE_NINJA)
        executable(os.path.join(tools, "cmake"), "#!/bin/sh\n")
        executable(os.path.join(tools, "nvcc"), FAKE_NVCC)
        executable(os.path.join(tools, "python"), FAKE_PYTHON)
        cls.env = dict(os.environ, PATH=tools + ":" + os.environ["PATH"],
                       NVCC=os.path.join(tools, "nvcc"), PYTHON=os.path.join(tools, "python"),
                       GIT_DIR=os.path.join(root, "no-git"))
        # Every declared item, the patterned trainers at some rows.
        cls.items = [f"{kind}:{name.replace('*', '20')}" for kind, table in cls.products.kinds.items()
                     for name in table["names"]] + list(cls.products.items)
        cls.result = cls.prepare("--items", *cls.items)

    @classmethod
    def prepare(cls, *args):
        return subprocess.run(["bash", os.path.join(cls.root, "scripts", "device-prepare.sh"), *args],
                              capture_output=True, text=True, env=cls.env, timeout=120)

    def test_every_item_leaves_its_files(self):
        self.assertEqual(self.result.returncode, 0, self.result.stdout + self.result.stderr)
        for item in self.items:
            for path in self.products.files(item):
                self.assertTrue(os.path.exists(os.path.join(self.root, ".device", path)),
                                f"{item}: .device/{path} missing")

    def spec(self, trainer):
        with open(os.path.join(self.root, ".device", "ref", f"{trainer}-manifest.json")) as f:
            return tomllib.loads(json.load(f)["spec"])

    def test_derived_specs(self):
        self.assertEqual(self.result.returncode, 0, self.result.stderr)
        rows = self.spec("qwen3-8b-rows-20")
        self.assertEqual((rows["name"], rows["training"]["rows_per_gpu"]), ("qwen3-8b-rows-20", 20))
        self.assertNotIn("memory", rows)
        recompute = self.spec("qwen3-8b-recompute-rows-20")
        self.assertEqual(recompute["training"]["rows_per_gpu"], 20)
        self.assertEqual(recompute["memory"], {"recompute_activations": True})
        self.assertEqual(self.spec("tiny-mlp")["memory"],
                         {"recompute_activations": True, "recompute_mlp_products": True})
        self.assertEqual(self.spec("tiny-zero1")["parallel"],
                         {"gpus_per_node": 2, "bucket_mib": 1, "shard_optimizer_state": True})
        self.assertEqual(self.spec("qwen3-8b-zero1")["parallel"],
                         {"gpus_per_node": 2, "shard_optimizer_state": True})
        self.assertEqual(self.spec("tiny")["name"], "tiny")
        self.assertEqual(self.spec("qwen3-8b")["training"]["rows_per_gpu"], 4)

    def test_validated_and_allowing_trainers_pass_their_kernels_flags(self):
        self.assertEqual(self.result.returncode, 0, self.result.stderr)

        def args(trainer):
            with open(os.path.join(self.root, ".device", "ref", f"{trainer}-manifest.json")) as f:
                manifest = json.load(f)
            self.assertEqual(tomllib.loads(manifest["spec"])["training"]["seq_len"], 20 * 1024)
            return [a for a in manifest["args"] if a.startswith("--allow")]

        self.assertEqual(args("qwen3-8b-s20k"), ["--allow-unvalidated-kernels"])
        self.assertEqual(args("qwen3-8b-s20k-validated"), [])
        self.assertEqual(args("qwen3-8b-s20k-allowing-20"), ["--allow-unvalidated-kernel=20"])

    def test_online_targets_use_their_configs(self):
        with open(os.path.join(self.root, ".device", "ref", "tiny-manifest.json")) as f:
            self.assertIsNone(json.load(f)["target"])
        self.assertTrue(os.path.exists(os.path.join(self.root, ".device", "bin", "train-q8o")))

    def test_unknown_items_are_refused(self):
        for item, message in (("trainer:tiny-huge", "no trainer 'tiny-huge'"),
                              ("online:q9", "no online target 'q9'"),
                              ("test:NoSuchGpuTest", "no GPU test build-dev/test/gpu/NoSuchGpuTest"),
                              ("widget", "unknown item 'widget'")):
            out = self.prepare("--items", item)
            self.assertEqual(out.returncode, 2, item)
            self.assertIn(message, out.stderr)
        self.assertIn("--items needs at least one item", self.prepare("--items").stderr)


if __name__ == "__main__":
    unittest.main()
