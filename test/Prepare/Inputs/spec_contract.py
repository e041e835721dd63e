"""The spec contract of the data tools: dflash_prepare.spec.read_spec (the
reader dflash-prepare uses where no dflashc is at hand) reads a spec as
`dflashc SPEC --emit=spec` does.

- Its schema (dflash_prepare.spec.SCHEMA) is the read calls of
  compiler/Spec/Spec.cpp: the same tables in the same order, the same keys,
  types, required keys and bounds.
- Every spec of SPECS_DIR, and small generated specs that leave every
  optional key out and sweep the spread rule of the default taps: both accept
  or both refuse, and every field read_spec resolves equals dflashc's (a
  field of Spec the contract does not compare fails too).
- test/unit/SpecTest.cpp's broken specs (each with the message and line
  that test expects of dflashc), and broken variants of the shipped specs
  (a table or key misspelt, each key of a wrong type or out of range,
  non-UTF-8 bytes, and more): both refuse, on the same line; with the same
  diagnostic to the letter (`FILE:LINE:COL: error: ...`), but for TOML
  syntax errors, where only the line is compared (TOML++ and tomllib word
  them their own ways).

  spec_contract.py ROOT WORK_DIR

Needs dflashc on PATH and dflash_prepare importable (lit sets PYTHONPATH).
Exit status 1 on any disagreement, each named with the spec and the field."""
import dataclasses
import os
import re
import subprocess
import sys
import tomllib

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from dflash_prepare.errors import UserError  # noqa: E402
from dflash_prepare.spec import SCHEMA, TABLES, Spec, read_spec  # noqa: E402
from spec_sources import cpp_error_cases, cpp_schema  # noqa: E402

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
    # dflashc prints the edges only where there are some or they were given.
    "position_buckets": ("training.position_buckets",
                         canonical_value("training", "position_buckets", [])),
    # dflashc prints [drafter.dflash2] for a DFlash2 drafter alone.
    "dflash2": ("drafter.dflash2",
                lambda canonical: "dflash2" in canonical.values["drafter"]),
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

# Broken and unusual specs written by hand: (name, text). A new user's
# mistakes first.
HAND_WRITTEN = [
    ("typo-table", REQUIRED_ONLY.format(n=8, k=2) + "[trainng]\nseq_len = 2048\n"),
    ("typo-key", REQUIRED_ONLY.format(n=8, k=2) + "[training]\nseq_lenn = 2048\n"),
    ("wrong-type", REQUIRED_ONLY.format(n=8, k=2) + "[training]\nseq_len = \"2048\"\n"),
    ("out-of-range", REQUIRED_ONLY.format(n=8, k=2) + "[training]\nseq_len = 1\n"),
    ("too-large", REQUIRED_ONLY.format(n=8, k=2) + "[training]\nseq_len = 4194304\n"),
    ("bool-for-int", REQUIRED_ONLY.format(n=8, k=2) + "[training]\nseq_len = true\n"),
    ("int-for-bool", REQUIRED_ONLY.format(n=8, k=2).replace(
        "vocab_size = 128", "vocab_size = 128\ntie_word_embeddings = 1")),
    ("table-not-table", REQUIRED_ONLY.format(n=8, k=2) + "training = 5\n"),
    ("array-of-tables", REQUIRED_ONLY.format(n=8, k=2) + "[[training]]\nseq_len = 64\n"),
    ("unknown-sub-table", REQUIRED_ONLY.format(n=8, k=2) + "[drafter.extra]\nx = 1\n"),
    ("non-utf8-value", REQUIRED_ONLY.format(n=8, k=2).replace(
        'name = "spread-8-2"', 'name = "caf\udce9"')),
    ("non-utf8-comment", REQUIRED_ONLY.format(n=8, k=2) + "# caf\udce9\n"),
    ("non-utf8-line-start", REQUIRED_ONLY.format(n=8, k=2) + "\udcff = 1\n"),
    ("byte-order-mark", "\ufeff" + REQUIRED_ONLY.format(n=8, k=2)),
    ("inline-table", 'name = "inline"\ntarget = {num_layers = 8, hidden_size = 64, '
     'vocab_size = 128}\ndrafter = { num_layers = 2, intermediate_size = 128, num_heads = 2, '
     'num_kv_heads = 1, head_dim = 32, block_size = 4, mask_token_id = 128 }\n'),
    ("dotted-keys", 'name = "dotted"\ntarget.num_layers = 8\ntarget.hidden_size = 64\n'
     'target.vocab_size = 128\n[drafter]\nnum_layers = 2\nintermediate_size = 128\n'
     'num_heads = 2\nnum_kv_heads = 1\nhead_dim = 31\nblock_size = 4\nmask_token_id = 127\n'),
    ("multi-line-taps", REQUIRED_ONLY.format(n=8, k=2).replace(
        "vocab_size = 128", "vocab_size = 128\nlayer_ids = [\n  1,  # first\n  \"5\",\n]")),
    ("quoted-key", REQUIRED_ONLY.format(n=8, k=2).replace('head_dim', '"head dim"')),
    ("strings-with-brackets", REQUIRED_ONLY.format(n=8, k=2).replace(
        'name = "spread-8-2"', "name = '''[x]\n# not a comment\n'''\n[target.\"a]\"]\n"
        "y = 1\n")),
    ("nan", REQUIRED_ONLY.format(n=8, k=2) + "[optimizer]\nlr = nan\n"),
    ("inf", REQUIRED_ONLY.format(n=8, k=2) + "[memory]\ngpu_memory_gib = inf\n"),
    ("syntax", REQUIRED_ONLY.format(n=8, k=2) + "[training\n"),
    ("end-of-file", REQUIRED_ONLY.format(n=8, k=2) + "[optimizer]\nlr = [\n"),
    ("duplicate-key", REQUIRED_ONLY.format(n=8, k=2) + "[training]\nseq_len = 64\n"
     "seq_len = 65\n"),
    ("empty", ""),
    # [drafter.rope_scaling]: accepted, and each rule broken.
    ("yarn", REQUIRED_ONLY.format(n=8, k=2) + "[drafter.rope_scaling]\nrope_type = \"yarn\"\n"
     "factor = 4.0\noriginal_max_position_embeddings = 8192\n"),
    ("yarn-type", REQUIRED_ONLY.format(n=8, k=2) + "[drafter.rope_scaling]\n"
     "rope_type = \"dynamic\"\nfactor = 4.0\noriginal_max_position_embeddings = 8192\n"),
    ("yarn-factor", REQUIRED_ONLY.format(n=8, k=2) + "[drafter.rope_scaling]\n"
     "rope_type = \"yarn\"\nfactor = 1\noriginal_max_position_embeddings = 8192\n"),
    ("yarn-factor-type", REQUIRED_ONLY.format(n=8, k=2) + "[drafter.rope_scaling]\n"
     "rope_type = \"yarn\"\nfactor = \"4\"\noriginal_max_position_embeddings = 8192\n"),
    ("yarn-original", REQUIRED_ONLY.format(n=8, k=2) + "[drafter.rope_scaling]\n"
     "rope_type = \"yarn\"\nfactor = 4.0\noriginal_max_position_embeddings = 40960\n"),
    ("yarn-original-float", REQUIRED_ONLY.format(n=8, k=2) + "[drafter.rope_scaling]\n"
     "rope_type = \"yarn\"\nfactor = 4.0\noriginal_max_position_embeddings = 8192.0\n"),
    ("yarn-missing", REQUIRED_ONLY.format(n=8, k=2) + "[drafter.rope_scaling]\n"
     "rope_type = \"yarn\"\nfactor = 4.0\n"),
    ("yarn-unknown", REQUIRED_ONLY.format(n=8, k=2) + "[drafter.rope_scaling]\n"
     "rope_type = \"yarn\"\nfactor = 4.0\noriginal_max_position_embeddings = 8192\n"
     "mscale = 1.0\n"),
    ("yarn-betas", REQUIRED_ONLY.format(n=8, k=2) + "[drafter.rope_scaling]\n"
     "rope_type = \"yarn\"\nfactor = 4.0\noriginal_max_position_embeddings = 8192\n"
     "beta_fast = 0.5\n"),
    ("yarn-not-table", REQUIRED_ONLY.format(n=8, k=2).replace(
        "mask_token_id = 127", "mask_token_id = 127\nrope_scaling = 4")),
    # [drafter.dflash2] and [training.dflash2]: accepted (empty, and every key
    # given), and the rules SpecTest.cpp's cases cannot reach.
    ("dflash2-empty", REQUIRED_ONLY.format(n=8, k=2) + "[drafter.dflash2]\n"),
    ("dflash2-all", REQUIRED_ONLY.format(n=8, k=2) + "[drafter.dflash2]\n"
     "conv_kernel_size = 4\nconv_group_size = 8\nselector_rank = 2\nselector_top_k = 64\n"
     "output_multiplier = 2\nfinal_logit_softcapping = 30.0\ninput_embedding_scale = 0.5\n"
     "[training.dflash2]\nselector_alpha = 0\nselector_warmup_ratio = 0.5\n"
     "selector_ramp_ratio = 0.5\nselector_stop_gradient = true\nselector_gold = \"inject\"\n"
     "selector_denominator = \"all\"\n"),
    ("dflash2-covered", REQUIRED_ONLY.format(n=8, k=2) + "[drafter.dflash2]\n"
     "[training.dflash2]\nselector_denominator = \"covered\"\n"),
    ("dflash2-top-k-past-vocabulary", REQUIRED_ONLY.format(n=8, k=2).replace(
        "vocab_size = 128", "vocab_size = 48").replace("mask_token_id = 127",
                                                       "mask_token_id = 47")
     + "[drafter.dflash2]\nselector_top_k = 49\n"),
    ("dflash2-training-not-table", REQUIRED_ONLY.format(n=8, k=2)
     + "[drafter.dflash2]\n[training]\ndflash2 = 1\n"),
    ("dflash2-training-alone-and-broken", REQUIRED_ONLY.format(n=8, k=2)
     + "[training.dflash2]\nselector_gold = 5\n"),
    ("dflash2-gold-type", REQUIRED_ONLY.format(n=8, k=2) + "[drafter.dflash2]\n"
     "[training.dflash2]\nselector_gold = 5\n"),
    ("dflash2-softcap-string", REQUIRED_ONLY.format(n=8, k=2) + "[drafter.dflash2]\n"
     "final_logit_softcapping = \"30\"\n"),
]


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
    result = subprocess.run(["dflashc", path, "--emit=spec"], capture_output=True)
    if result.returncode != 0:
        return None, result.stderr.decode("utf-8", "replace").strip()
    return Canonical(result.stdout.decode()), None


def python_spec(path):
    try:
        return read_spec(path), None
    except UserError as error:
        return None, str(error)


_DIAGNOSTIC = re.compile(r"^.*?:(\d+):(\d+): error: (.*)$", re.DOTALL)


def diagnosed(error):
    """(line, field or None, message) of one `FILE:LINE:COL: error: ...`
    line; the field is the first key in quotes or table in brackets, not
    taken from a TOML syntax error."""
    match = _DIAGNOSTIC.match(error)
    if not match:
        return None, None, error
    message = match.group(3)
    field = None
    if not message.startswith("invalid TOML"):
        named = re.search(r"'([^']+)'|\[(\w+)\]", message)
        field = named and (named.group(1) or named.group(2))
    return int(match.group(1)), field, message


def compare(path, must_accept=False, expect=None):
    """The disagreements of one spec, as messages naming it and the field.
    `expect`: (message, line) SpecTest.cpp expects of the error."""
    canonical, cpp_error = dflashc_spec(path)
    spec, python_error = python_spec(path)
    if canonical is None and spec is None:
        if must_accept:
            return [f"{path}: dflashc refuses it, so nothing is compared: {cpp_error}"]
        problems = []
        (cpp_line, cpp_field, cpp_message), (py_line, py_field, py_message) = (
            diagnosed(cpp_error), diagnosed(python_error))
        syntax = cpp_message.startswith("invalid TOML") or py_message.startswith("invalid TOML")
        if cpp_line != py_line:
            problems.append(f"{path}: dflashc refuses it on line {cpp_line}, read_spec on "
                            f"line {py_line}:\n  {cpp_error}\n  {python_error}")
        elif cpp_field != py_field:
            problems.append(f"{path}: dflashc names '{cpp_field}', read_spec '{py_field}':"
                            f"\n  {cpp_error}\n  {python_error}")
        elif not syntax and cpp_error != python_error:
            problems.append(f"{path}: dflashc and read_spec word it differently:"
                            f"\n  {cpp_error}\n  {python_error}")
        if expect and (expect[0] not in py_message or py_line != expect[1]):
            problems.append(f"{path}: SpecTest.cpp expects '{expect[0]}' on line "
                            f"{expect[1]}; read_spec says: {python_error}")
        return problems
    if canonical is None:
        return [f"{path}: dflashc refuses it but read_spec accepts it: {cpp_error}"]
    if spec is None:
        return [f"{path}: read_spec refuses it but dflashc accepts it: {python_error}"]
    if expect:
        return [f"{path}: both accept what SpecTest.cpp expects refused: {expect[0]}"]
    problems = []
    for field, (key, stated) in CONTRACT.items():
        ours, theirs = getattr(spec, field), stated(canonical)
        if ours != theirs:
            problems.append(f"{path}: '{key}': dflashc --emit=spec resolves {theirs!r}, "
                            f"read_spec gives {ours!r} (Spec.{field})")
    # The text the trainer compares with a shard's target_layer_ids.
    if spec.layer_ids_text() != canonical.layer_ids_text:
        problems.append(f"{path}: 'target.layer_ids' as text: dflashc prints "
                        f"{canonical.layer_ids_text!r}, Spec.layer_ids_text() gives "
                        f"{spec.layer_ids_text()!r}")
    return problems


def schema_problems(spec_cpp):
    """SCHEMA against the read calls of Spec.cpp."""
    keys, tables = cpp_schema(spec_cpp)
    problems = []
    if tuple(tables) != TABLES:
        problems.append(f"{spec_cpp} reads the tables {tables}; dflash_prepare.spec.TABLES "
                        f"says {list(TABLES)}")
    # The top-level tables, then sub-tables ([drafter.rope_scaling]).
    subtables = sorted({k.table for k in list(keys) + list(SCHEMA)} - {""} - set(TABLES))
    for table in ("",) + TABLES + tuple(subtables):
        cpp = [k for k in keys if k.table == table]
        ours = [k for k in SCHEMA if k.table == table]
        if cpp != ours:
            problems.append(f"[{table}]: {spec_cpp} reads\n    "
                            + "\n    ".join(map(str, cpp)) + "\n  dflash_prepare.spec.SCHEMA "
                            "says\n    " + "\n    ".join(map(str, ours)))
    return problems


def _write(path, text):
    """Writes `text`; the surrogates \\udc80-\\udcff stand for single bytes
    that are not UTF-8."""
    with open(path, "wb") as f:
        f.write(text.encode("utf-8", "surrogateescape"))
    return path


def broken_variants(text):
    """(what, (the key or table broken, how), text) of one shipped spec
    broken one way at a time: each table header misspelt, and each key misspelt, of another
    type, or out of range in turn."""
    lines = text.split("\n")
    variants = []
    for index, line in enumerate(lines):
        def varied(new, what):
            variants.append((f"line {index + 1} {what}", (line.split(" ")[0], what),
                             "\n".join(lines[:index] + [new] + lines[index + 1:])))
        header = re.fullmatch(r"\[(\w+)\]", line)
        if header:
            varied(f"[{header.group(1)[:-1]}]", "table misspelt")
            continue
        entry = re.fullmatch(r"(\w+) = (.*)", line)
        if not entry:
            continue
        key, value = entry.groups()
        varied(f"{key[:-1]}{key[-1] * 2} = {value}", "key misspelt")
        varied(f"{key} = {'5' if value.startswith(chr(34)) else chr(34) + 'x' + chr(34)}",
               "wrong type")
        if re.fullmatch(r"-?[0-9][0-9_.e+-]*", value):
            varied(f"{key} = -1", "out of range")
            varied(f"{key} = {1 << 62}", "too large")
    return variants


def main(argv):
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    root, work = argv[1], argv[2]
    specs_dir = os.path.join(root, "specs")
    os.makedirs(work, exist_ok=True)
    problems = schema_problems(os.path.join(root, "compiler", "Spec", "Spec.cpp"))
    # A field read_spec resolves that the contract does not compare is drift too.
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
    refused = 0
    for n, k in SWEEP:
        path = _write(os.path.join(work, f"spread-{n}-{k}.toml"), REQUIRED_ONLY.format(n=n, k=k))
        problems += compare(path)
        refused += dflashc_spec(path)[0] is None
    base, cases = cpp_error_cases(os.path.join(root, "test", "unit", "SpecTest.cpp"))
    for case in cases:
        path = _write(os.path.join(work, f"SpecTest-{case.name}.toml"), case.text(base))
        problems += compare(path, expect=(case.message, case.line(base)))
    for name, text in HAND_WRITTEN:
        problems += compare(_write(os.path.join(work, f"{name}.toml"), text))
    variants, seen = 0, set()
    for path in (os.path.join(specs_dir, "tiny.toml"),
                 os.path.join(specs_dir, "qwen3.6-27b-b16.toml")):
        with open(path) as f:
            text = f.read()
        for index, (what, line, variant) in enumerate(broken_variants(text)):
            if line in seen:
                continue  # the same key broken the same way in another spec
            seen.add(line)
            out = os.path.join(work, f"{os.path.basename(path)[:-5]}-{index}.toml")
            problems += [f"{p} ({what})" for p in compare(_write(out, variant))]
            variants += 1
    for problem in problems:
        print(f"{PROG}: error: {problem}", file=sys.stderr)
    if problems:
        return 1
    print(f"{PROG}: the schema is Spec.cpp's ({len(SCHEMA)} keys in {len(TABLES) + 1} tables)")
    print(f"{PROG}: {len(shipped)} shipped and {len(SWEEP)} generated specs agree on "
          f"{len(CONTRACT)} fields ({refused} generated ones refused by both)")
    print(f"{PROG}: {len(cases)} broken specs of SpecTest.cpp, {len(HAND_WRITTEN)} written "
          f"here and {variants} broken shipped specs: refused alike, the same diagnostics")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
