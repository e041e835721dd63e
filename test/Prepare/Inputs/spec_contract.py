"""The spec contract of the data tools: every field that
dflash_prepare.spec.load_spec resolves equals what `dflashc SPEC --emit=spec`
(the canonical spec, every default resolved) says, for every spec of SPECS_DIR
and for small generated specs that leave every optional key out and sweep the
spread rule of the default taps (which both sides must then accept or refuse
alike).

  spec_contract.py SPECS_DIR WORK_DIR

Needs dflashc on PATH and dflash_prepare importable (lit sets PYTHONPATH).
Exit status 1 on any disagreement, each named with the spec and the field."""
import dataclasses
import os
import re
import subprocess
import sys
import tomllib

from dflash_prepare.errors import UserError
from dflash_prepare.spec import Spec, load_spec

PROG = "spec-contract"


def canonical_value(table, key, absent=None):
    def get(canonical):
        section = canonical.values.get(table, {}) if table else canonical.values
        return section.get(key, absent)
    return get


# Spec field -> (the spec key it resolves, how the canonical spec states it).
CONTRACT = {
    "name": ("name", canonical_value(None, "name")),
    # dflashc prints [target] model only where it is set.
    "target_model": ("target.model", canonical_value("target", "model", "")),
    "target_num_layers": ("target.num_layers", canonical_value("target", "num_layers")),
    "hidden_size": ("target.hidden_size", canonical_value("target", "hidden_size")),
    "vocab_size": ("target.vocab_size", canonical_value("target", "vocab_size")),
    "layer_ids": ("target.layer_ids", canonical_value("target", "layer_ids")),
    "layer_ids_defaulted": ("target.layer_ids (defaulted)",
                            lambda canonical: canonical.layer_ids_defaulted),
    "tie_word_embeddings": ("target.tie_word_embeddings",
                            canonical_value("target", "tie_word_embeddings")),
    "drafter_num_layers": ("drafter.num_layers", canonical_value("drafter", "num_layers")),
    "mask_token_id": ("drafter.mask_token_id", canonical_value("drafter", "mask_token_id")),
    "block_size": ("drafter.block_size", canonical_value("drafter", "block_size")),
    "seq_len": ("training.seq_len", canonical_value("training", "seq_len")),
    "anchors_per_row": ("training.anchors_per_row",
                        canonical_value("training", "anchors_per_row")),
}
# Spec fields that are not read from the spec's keys.
NOT_RESOLVED = {"path"}

# The generated specs: only the required keys. (target layers, drafter
# layers) pairs whose spread rule rounds half down (7, 3), half up (9, 3),
# has one drafter layer, or gives no distinct taps (3, 3), (4, 3), (7, 5).
# Blocks of 8: a block size without a default gamma needs the key.
SWEEP = [(n, k) for n in (3, 4, 7, 9, 61) for k in (1, 3, 5)]
REQUIRED_ONLY = """\
name = "spread-{n}-{k}"
[target]
num_layers = {n}
hidden_size = 64
vocab_size = 128
[drafter]
num_layers = {k}
intermediate_size = 128
num_heads = 2
num_kv_heads = 1
head_dim = 32
block_size = 8
mask_token_id = 127
"""


class Canonical:
    """What `dflashc SPEC --emit=spec` prints: the values, and whether the
    taps came from the spread rule (said in a comment)."""

    def __init__(self, text):
        self.text = text
        self.values = tomllib.loads(text)
        line = re.search(r"^layer_ids = (\[[^\]]*\])(.*)$", text, re.MULTILINE)
        self.layer_ids_text = line.group(1) if line else None
        self.layer_ids_defaulted = bool(line) and "default: spread rule" in line.group(2)


def dflashc_spec(path):
    """(Canonical, None) where dflashc accepts the spec, else (None, its error)."""
    result = subprocess.run(["dflashc", path, "--emit=spec"], capture_output=True, text=True)
    if result.returncode != 0:
        return None, result.stderr.strip()
    return Canonical(result.stdout), None


def python_spec(path):
    try:
        return load_spec(path), None
    except UserError as error:
        return None, str(error)


def compare(path, must_accept):
    """The disagreements of one spec, as messages naming it and the field."""
    canonical, cpp_error = dflashc_spec(path)
    spec, python_error = python_spec(path)
    if canonical is None and spec is None:
        if must_accept:
            return [f"{path}: dflashc refuses it, so nothing is compared: {cpp_error}"]
        return []
    if canonical is None:
        return [f"{path}: dflashc refuses it but load_spec accepts it: {cpp_error}"]
    if spec is None:
        return [f"{path}: load_spec refuses it but dflashc accepts it: {python_error}"]
    problems = []
    for field, (key, stated) in CONTRACT.items():
        ours, theirs = getattr(spec, field), stated(canonical)
        if ours != theirs:
            problems.append(f"{path}: '{key}': dflashc --emit=spec resolves {theirs!r}, "
                            f"load_spec gives {ours!r} (Spec.{field})")
    # The text the trainer compares with a shard's target_layer_ids.
    if spec.layer_ids_text() != canonical.layer_ids_text:
        problems.append(f"{path}: 'target.layer_ids' as text: dflashc prints "
                        f"{canonical.layer_ids_text!r}, Spec.layer_ids_text() gives "
                        f"{spec.layer_ids_text()!r}")
    return problems


def main(argv):
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    specs_dir, work = argv[1], argv[2]
    problems = []
    # A field load_spec resolves that the contract does not compare is drift too.
    for field in dataclasses.fields(Spec):
        if field.name not in CONTRACT and field.name not in NOT_RESOLVED:
            problems.append(f"Spec.{field.name} (dflash_prepare/spec.py) is not compared "
                            f"with dflashc's: add it to CONTRACT in {__file__}")
    shipped = sorted(os.path.join(specs_dir, name) for name in os.listdir(specs_dir)
                     if name.endswith(".toml"))
    if not shipped:
        problems.append(f"{specs_dir}: has no *.toml specs")
    for path in shipped:
        problems += compare(path, must_accept=True)
    os.makedirs(work, exist_ok=True)
    refused = 0
    for n, k in SWEEP:
        path = os.path.join(work, f"spread-{n}-{k}.toml")
        with open(path, "w") as f:
            f.write(REQUIRED_ONLY.format(n=n, k=k))
        problems += compare(path, must_accept=False)
        refused += dflashc_spec(path)[0] is None
    for problem in problems:
        print(f"{PROG}: error: {problem}", file=sys.stderr)
    if problems:
        return 1
    print(f"{PROG}: {len(shipped)} shipped and {len(SWEEP)} generated specs agree on "
          f"{len(CONTRACT)} fields ({refused} generated ones refused by both)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
