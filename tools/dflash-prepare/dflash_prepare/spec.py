"""The drafter spec as the data tools read it (docs/spec.md).

dflashc is the authority on a spec. Where a dflashc binary is at hand
($DFLASHC, else this checkout's build/bin/dflashc, else one on PATH;
DFLASHC=none for none), `load_spec` has it check the spec
(`dflashc SPEC --emit=spec`) and passes its diagnostics through verbatim.
Either way `read_spec` then reads the spec as dflashc's reader
(compiler/Spec/Spec.cpp) does: the same tables and keys (SCHEMA), types,
ranges and rules, in the same order, so the first error is the same one,
`FILE:LINE:COL: error: ...` naming the key. tomllib has no positions: a
small scan of the text (`_Positions`) finds each key's line and column.

test/Prepare/spec-contract.test holds the two readers to each other: SCHEMA
against the read calls of Spec.cpp, both readers over the shipped specs,
test/unit/SpecTest.cpp's broken specs and more, and every field of Spec to
what `dflashc SPEC --emit=spec` resolves.
"""
import dataclasses
import math
import os
import re
import shutil
import subprocess
from fractions import Fraction

from .errors import UserError, warn


@dataclasses.dataclass
class Spec:
    path: str
    name: str
    target_model: str
    target_num_layers: int
    hidden_size: int
    vocab_size: int
    layer_ids: list
    layer_ids_defaulted: bool
    drafter_num_layers: int
    mask_token_id: int
    block_size: int
    seq_len: int
    anchors_per_row: int
    tie_word_embeddings: bool
    position_buckets: list
    # A DFlash2 drafter ([drafter.dflash2], docs/semantics.md section 13):
    # it trains on the same tokens and features as a DFlash drafter.
    dflash2: bool

    @property
    def context_width(self):
        """L*H: the width of one row of `hidden_states`."""
        return len(self.layer_ids) * self.hidden_size

    def layer_ids_text(self):
        """`target_layer_ids` as the C++ runtime writes and compares it."""
        return "[" + ", ".join(str(i) for i in self.layer_ids) + "]"

    def shard_metadata(self):
        """The `__metadata__` fields the trainer checks against its spec."""
        return {
            "target": self.target_model,
            "target_layer_ids": self.layer_ids_text(),
            "hidden_size": str(self.hidden_size),
            "seq_len": str(self.seq_len),
        }


class SpecError(UserError):
    """A spec refused: printed as it is (`FILE:LINE:COL: error: ...`, the
    form dflashc prints), without the tool's prefix."""

    bare = True


def default_layer_ids(num_target, num_draft):
    """docs/semantics.md section 7: round_half_even(1 + i*(n-4)/(k-1)), exact."""
    if num_draft == 1:
        return [num_target // 2]
    return [round(1 + Fraction(i * (num_target - 4), num_draft - 1))
            for i in range(num_draft)]


# The schema: what SpecReader::run of compiler/Spec/Spec.cpp reads, table by
# table in its order, each key as its read call states it. Integers: bounds
# [low, high]; floats: positive (> 0, or >= 0 with allow_zero); "ints" an
# array of integers; "raw" a key its table's rules read themselves.
@dataclasses.dataclass(frozen=True)
class Key:
    table: str
    key: str
    kind: str                 # int, float, bool, string, ints, raw
    required: bool = False
    low: int = None
    high: int = None
    positive: bool = False
    allow_zero: bool = False


_INT64_MIN, _INT64_MAX, _INT32_MAX = -(1 << 63), (1 << 63) - 1, (1 << 31) - 1
_INT_HIGH = 1 << 40  # readInt's default bound


def _keys(table, *entries):
    return [Key(table, *entry) for entry in entries]


SCHEMA = (
    _keys("", ("name", "string", True))
    + _keys("target",
            ("model", "string"), ("path", "string"),
            ("num_layers", "int", True, 1, 100000),
            ("hidden_size", "int", True, 1, 1 << 20),
            ("vocab_size", "int", True, 2, 1 << 24),
            ("layer_ids", "ints"), ("tie_word_embeddings", "bool"))
    + _keys("drafter",
            ("num_layers", "int", True, 1, 1024),
            ("hidden_size", "int", False, 1, 1 << 20),
            ("intermediate_size", "int", True, 1, 1 << 22),
            ("num_heads", "int", True, 1, 1024),
            ("num_kv_heads", "int", True, 1, 1024),
            ("head_dim", "int", True, 2, 1024),
            ("rms_norm_eps", "float", False, None, None, True),
            ("rope_theta", "float", False, None, None, True),
            ("block_size", "int", True, 2, 1024),
            ("mask_token_id", "int", True, 0, 1 << 24),
            ("max_position_embeddings", "int", False, 1, 1 << 31),
            ("rope_scaling", "raw"), ("dflash2", "raw"))
    + _keys("drafter.rope_scaling",
            ("rope_type", "string", True),
            ("factor", "float", True),
            ("original_max_position_embeddings", "int", True, 1, 1 << 31),
            ("beta_fast", "float", False, None, None, True),
            ("beta_slow", "float", False, None, None, True),
            ("truncate", "bool"),
            ("attention_factor", "float", False, None, None, True))
    + _keys("drafter.dflash2",
            ("conv_kernel_size", "int", False, 1, 1 << 10),
            ("conv_group_size", "int", False, 1, 1 << 20),
            ("selector_rank", "int", False, 1, 1 << 16),
            ("selector_top_k", "int", False, 1, 1 << 24),
            ("output_multiplier", "float", False, None, None, True),
            ("final_logit_softcapping", "float", False, None, None, True),
            ("input_embedding_scale", "float", False, None, None, True))
    + _keys("attention",
            ("default", "string"),
            ("sliding_window", "int", False, _INT64_MIN, 1 << 31),
            ("layers", "raw"))
    + _keys("training",
            ("seq_len", "int", False, 2, 1 << 20),
            ("anchors_per_row", "int", False, 1, 1 << 20),
            ("rows_per_gpu", "int", False, 1, 1 << 16),
            ("gradient_accumulation", "int", False, 1, 1 << 12),
            ("gamma", "float", False, None, None, True, True),
            ("seed", "int", False, 0, _INT64_MAX),
            ("init_std", "float", False, None, None, True),
            ("position_buckets", "ints"), ("dflash2", "raw"))
    + _keys("training.dflash2",
            ("selector_alpha", "float", False, None, None, True, True),
            ("selector_warmup_ratio", "float", False, None, None, True, True),
            ("selector_ramp_ratio", "float", False, None, None, True, True),
            ("selector_stop_gradient", "bool"),
            ("selector_gold", "string"),
            ("selector_denominator", "string"))
    + _keys("optimizer",
            ("lr", "float", False, None, None, True),
            ("warmup_ratio", "float", False, None, None, True, True),
            ("max_grad_norm", "float", False, None, None, True),
            ("weight_decay", "float", False, None, None, True, True),
            ("beta1", "float", False, None, None, True, True),
            ("beta2", "float", False, None, None, True, True),
            ("eps", "float", False, None, None, True),
            ("total_steps", "int", False, 1, _INT32_MAX))
    + _keys("parallel",
            ("gpus_per_node", "int", False, 1, 1024),
            ("nodes", "int", False, 1, 1 << 16),
            ("bucket_mib", "int", False, 1, 1 << 16),
            ("shard_optimizer_state", "bool"))
    + _keys("memory",
            ("gpu_memory_gib", "float", False, None, None, True),
            ("recompute_activations", "bool"),
            ("recompute_mlp_products", "bool"),
            ("fuse_target_mlp", "bool"))
)
TABLES = ("target", "drafter", "attention", "training", "optimizer", "parallel", "memory")
REQUIRED_TABLES = ("target", "drafter")

# The loss decay's default by block size (docs/semantics.md section 4); other
# block sizes must give 'training.gamma'.
DEFAULT_GAMMA = {16: 7.0, 10: 5.0, 8: 4.0}
# The largest memory budget dflashc takes (compiler/Spec/Spec.h).
MAX_GPU_MEMORY_GIB = 1024.0
# The most anchor-position buckets a step reports (schema/ModelConfig.h).
MAX_POSITION_BUCKETS = 8
# The most taps of a DFlash2 convolution and candidates of its selector
# (kMaxConvKernelSize, kMaxSelectorTopK of schema/ModelConfig.h).
MAX_CONV_KERNEL_SIZE = 4
MAX_SELECTOR_TOP_K = 64


def default_position_buckets(seq_len):
    """The default bucket edges (docs/semantics.md section 14): 4K, 16K,
    64K, ... (4096 * 4^i), those below seq_len."""
    edges, edge = [], 4096
    while edge < seq_len:
        edges.append(edge)
        edge *= 4
    return edges

# The defaults of the keys the rules below need (schema/ModelConfig.h).
DEFAULTS = {"drafter.max_position_embeddings": 40960, "training.seq_len": 3072,
            "training.anchors_per_row": 512, "target.tie_word_embeddings": False,
            "target.model": "", "attention.default": "full",
            "drafter.dflash2.conv_kernel_size": 2, "drafter.dflash2.conv_group_size": 16,
            "drafter.dflash2.selector_top_k": 16,
            "training.dflash2.selector_alpha": 1.0,
            "training.dflash2.selector_warmup_ratio": 0.0,
            "training.dflash2.selector_ramp_ratio": 0.0,
            "training.dflash2.selector_gold": "topk",
            "training.dflash2.selector_denominator": "all"}


def _type_name(value):
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a float"
    return "a date or time"


def _edit_distance(a, b):
    row = list(range(len(b) + 1))
    for i in range(1, len(a) + 1):
        diag, row[0] = row[0], i
        for j in range(1, len(b) + 1):
            up = row[j]
            row[j] = min(row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] != b[j - 1]))
            diag = up
    return row[len(b)]


class _Positions:
    """Where each table, key and value of a valid TOML text starts, as
    (line, column), 1-based, columns in characters: `values` by dotted path
    (a table: its header; an array element: PATH.INDEX), `keys` the keys
    themselves. It scans, it does not check: tomllib has accepted the text."""

    _BARE = re.compile(r"[A-Za-z0-9_-]+")

    def __init__(self, text):
        self.text, self.i, self.line, self.col = text, 0, 1, 1
        self.values, self.keys = {}, {}
        table = ()
        while self._skip(newlines=True) is not None:
            at = self._at()
            if self.text.startswith("[", self.i):
                double = self.text.startswith("[[", self.i)
                self._advance(2 if double else 1)
                table = self._dotted_key(())
                self._skip()
                self._advance(2 if double else 1)
                self.values[".".join(table)] = at
            else:
                key = self._dotted_key(table)
                for depth in range(len(table) + 1, len(key)):
                    self.values.setdefault(".".join(key[:depth]), at)
                self._skip()
                self._advance()  # =
                self._skip()
                self._value(key)
            self._skip()
            while self.i < len(self.text) and self.text[self.i] != "\n":
                self._advance()  # what a valid line can still hold: nothing

    def _at(self):
        return (self.line, self.col)

    def _advance(self, count=1):
        for _ in range(count):
            if self.i >= len(self.text):
                return
            if self.text[self.i] == "\n":
                self.line, self.col = self.line + 1, 1
            else:
                self.col += 1
            self.i += 1

    def _skip(self, newlines=False):
        """Skips blanks and comments (and line ends where `newlines`);
        None at the end of the text."""
        while self.i < len(self.text):
            c = self.text[self.i]
            if c in " \t" or (newlines and c in "\r\n"):
                self._advance()
            elif c == "#":
                while self.i < len(self.text) and self.text[self.i] != "\n":
                    self._advance()
            else:
                return c
        return None

    def _string(self):
        """Skips the string at the cursor; returns its text (escapes as
        written, enough for keys)."""
        text = self.text
        for quote in ('"""', "'''", '"', "'"):
            if text.startswith(quote, self.i):
                break
        self._advance(len(quote))
        begin = self.i
        while self.i < len(text) and not text.startswith(quote, self.i):
            self._advance(2 if quote[0] == '"' and text[self.i] == "\\" else 1)
        end = self.i
        self._advance(len(quote))
        while len(quote) == 3 and self.i < len(text) and text[self.i] == quote[0]:
            self._advance()  # up to two quotes may close a multi-line string
            end += 1
        return text[begin:end]

    def _dotted_key(self, prefix):
        """`prefix` and the dotted key at the cursor; each part's place goes
        into `keys`."""
        parts = list(prefix)
        while True:
            self._skip()
            at = self._at()
            if self.i < len(self.text) and self.text[self.i] in "\"'":
                parts.append(self._string())
            else:
                match = self._BARE.match(self.text, self.i)
                part = match.group() if match else ""
                self._advance(max(len(part), 1) if match else 0)
                parts.append(part)
            self.keys.setdefault(".".join(parts), at)
            self._skip()
            if self.i < len(self.text) and self.text[self.i] == ".":
                self._advance()
                continue
            return tuple(parts)

    def _value(self, path):
        self.values.setdefault(".".join(path), self._at())
        c = self.text[self.i] if self.i < len(self.text) else ""
        if c in "\"'":
            self._string()
        elif c == "[":
            self._advance()
            index = 0
            while self._skip(newlines=True) not in (None, "]"):
                self._value(path + (str(index),))
                index += 1
                if self._skip(newlines=True) == ",":
                    self._advance()
            self._advance()
        elif c == "{":
            self._advance()
            while self._skip(newlines=True) not in (None, "}"):
                key = self._dotted_key(path)
                self._skip()
                self._advance()  # =
                self._skip()
                self._value(key)
                if self._skip(newlines=True) == ",":
                    self._advance()
            self._advance()
        else:
            begin = self.i
            while self.i < len(self.text) and self.text[self.i] not in ",]}#\r\n":
                self._advance()
            if self.i == begin:
                self._advance()  # never stuck, whatever the text


def _decode(path, data):
    """The spec's text; a byte that is not UTF-8 is an error at its place."""
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]  # a byte-order mark, which dflashc skips too
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        # At the character before the byte, where dflashc (TOML++) puts it.
        before = data[:error.start].decode("utf-8")[:-1]
        line = before.count("\n") + 1
        column = len(before) - (before.rfind("\n") + 1) + 1
        raise SpecError(f"{path}:{line}:{column}: error: invalid TOML: byte "
                        f"0x{data[error.start]:02X} after this point is not UTF-8 (a spec "
                        "is UTF-8 text)") from None


def _parse(path):
    """(the spec's TOML as a dict, its text)."""
    try:
        import tomllib
    except ImportError:
        raise UserError("reading a spec needs python >= 3.11 (tomllib)") from None
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise SpecError(f"{path}: error: cannot open spec file: no such file") from None
    except OSError as error:
        raise SpecError(f"{path}: error: cannot open spec file: "
                        f"{error.strerror}") from None
    text = _decode(path, data)
    try:
        return tomllib.loads(text), text
    except tomllib.TOMLDecodeError as error:
        message = str(error)
        where = re.search(r" \(at line (\d+), column (\d+)\)$", message)
        if where:
            message = message[:where.start()]
            at = f"{where.group(1)}:{where.group(2)}:"
        else:
            # At the end: just after the last character, as dflashc says.
            message = re.sub(r" \(at end of document\)$", "", message)
            before = text[:-1]
            at = f"{before.count(chr(10)) + 1}:{len(before) - before.rfind(chr(10)) + 1}:"
        raise SpecError(f"{path}:{at} error: invalid TOML: {message}") from None


class _Reader:
    """SpecReader of Spec.cpp in Python: every read stops at the first
    error, raised as SpecError at the entry's line and column."""

    def __init__(self, path, data, text, known_keys_only=True):
        self.path, self.data = path, data
        self.where = _Positions(text)
        self.known_keys_only = known_keys_only
        self.values = {}   # "table.key" -> value, the keys read (defaults not)
        self.dflash2 = False

    def fail(self, at, message):
        line, column = at if at else (0, 0)
        place = f"{self.path}:{line}:{column}" if line else self.path
        raise SpecError(f"{place}: error: {message}")

    def location(self, name):
        """The entry's place, or its nearest enclosing table's (as
        DrafterSpec::locationOf)."""
        while True:
            if name in self.where.values:
                return self.where.values[name]
            if "." not in name:
                return (1, 1) if not name else None
            name = name.rsplit(".", 1)[0]

    def fail_at(self, name, message):
        self.fail(self.location(name), message)

    def value(self, name, default=None):
        return self.values.get(name, DEFAULTS.get(name, default))

    def read_table(self, table):
        """Reads `table`'s keys in schema order, then refuses unknown keys,
        then a missing required key (a misspelt key shows as both)."""
        if table:
            node = self.data
            for part in table.split("."):  # a sub-table by its path
                node = node.get(part) if isinstance(node, dict) else None
            if node is None:
                if table in REQUIRED_TABLES:
                    self.fail((1, 1), f"missing table [{table}]")
                return None
            if not isinstance(node, dict):
                self.fail(self.where.values.get(table),
                          f"'{table}' must be a table, not {_type_name(node)}")
        else:
            node = self.data
        prefix = table + "." if table else ""
        missing = None
        keys = [k for k in SCHEMA if k.table == table]
        for key in keys:
            name = prefix + key.key
            if key.key not in node:
                if key.required and missing is None:
                    missing = f"missing required key '{name}'"
                continue
            self.values[name] = self.check(key, name, node[key.key])
        known = sorted(k.key for k in keys)
        for other in sorted(node):
            if other in known or (not table and other in TABLES) or not self.known_keys_only:
                continue
            where = f"in [{table}]" if table else "at the top level"
            hint = " (see docs/spec.md)"
            for candidate in known:
                if _edit_distance(other, candidate) <= 2:
                    hint = f"; did you mean '{candidate}'?"
            self.fail(self.where.keys.get(prefix + other),
                      f"unknown key '{prefix}{other}' {where}{hint}")
        if missing:
            self.fail(self.where.values.get(table, (1, 1)), missing)
        return node

    def check(self, key, name, value):
        at = self.where.values.get(name)
        if key.kind == "int":
            if not isinstance(value, int) or isinstance(value, bool):
                self.fail(at, f"'{name}' must be an integer, not {_type_name(value)}")
            if value < key.low:
                self.fail(at, f"'{name}' is {value}; it must be at least {key.low}")
            if value > (_INT_HIGH if key.high is None else key.high):
                self.fail(at, f"'{name}' is {value}; it must be at most "
                              f"{_INT_HIGH if key.high is None else key.high}")
        elif key.kind == "float":
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                self.fail(at, f"'{name}' must be a number, not {_type_name(value)}")
            value = float(value)
            if not math.isfinite(value):
                self.fail(at, f"'{name}' must be a finite number")
            if key.positive and not (value > 0 or (key.allow_zero and value == 0)):
                self.fail(at, f"'{name}' must be "
                              + ("zero or positive" if key.allow_zero else "positive"))
        elif key.kind == "bool":
            if not isinstance(value, bool):
                self.fail(at, f"'{name}' must be a boolean, not {_type_name(value)}")
        elif key.kind == "string":
            if not isinstance(value, str):
                self.fail(at, f"'{name}' must be a string, not {_type_name(value)}")
        elif key.kind == "ints":
            if not isinstance(value, list):
                self.fail(at, f"'{name}' must be an array of integers, not "
                              f"{_type_name(value)}")
            for i, element in enumerate(value):
                if not isinstance(element, int) or isinstance(element, bool):
                    self.fail(self.where.values.get(f"{name}.{i}"),
                              f"'{name}.{i}' must be an integer, not {_type_name(element)}")
        return value

    def read(self):
        self.read_table("")
        self.read_target()
        self.read_drafter()
        self.read_attention()
        self.read_training()
        self.read_table("optimizer")
        self.read_optimizer_rules()
        self.read_table("parallel")
        self.read_table("memory")
        budget = self.values.get("memory.gpu_memory_gib")
        if budget is not None and budget > MAX_GPU_MEMORY_GIB:
            self.fail_at("memory.gpu_memory_gib",
                         f"'memory.gpu_memory_gib' is {budget:g}; no GPU has more than "
                         f"{MAX_GPU_MEMORY_GIB:g} GiB (the budget is in GiB: 80 for an 80 GB card)")
        return self.resolve_taps()

    def read_target(self):
        self.read_table("target")
        ids = self.values.get("target.layer_ids")
        num = self.values["target.num_layers"]
        if ids is not None and not ids:
            self.fail_at("target.layer_ids", "'target.layer_ids' must name at least one layer")
        for i, layer in enumerate(ids or []):
            name = f"target.layer_ids.{i}"
            if not 0 <= layer < num:
                self.fail_at(name, f"'{name}' is {layer}, outside the target's layers "
                                   f"0..{num - 1}")
            if i and layer <= ids[i - 1]:
                self.fail_at(name, f"'target.layer_ids' must be strictly ascending, but "
                                   f"entry {i} ({layer}) follows {ids[i - 1]}")

    def read_drafter(self):
        self.read_table("drafter")
        v = self.values
        hidden = v.get("drafter.hidden_size", v["target.hidden_size"])
        heads, kv_heads = v["drafter.num_heads"], v["drafter.num_kv_heads"]
        if hidden != v["target.hidden_size"]:
            self.fail_at("drafter.hidden_size",
                         f"'drafter.hidden_size' ({hidden}) must equal 'target.hidden_size' "
                         f"({v['target.hidden_size']}): the drafter shares the target's "
                         "embedding")
        if hidden % heads:
            self.fail_at("drafter.num_heads",
                         f"'drafter.hidden_size' ({hidden}) is not divisible by "
                         f"'drafter.num_heads' ({heads})")
        if heads % kv_heads:
            self.fail_at("drafter.num_kv_heads",
                         f"'drafter.num_heads' ({heads}) is not divisible by "
                         f"'drafter.num_kv_heads' ({kv_heads})")
        if v["drafter.head_dim"] % 2:
            self.fail_at("drafter.head_dim", f"'drafter.head_dim' ({v['drafter.head_dim']}) "
                                             "must be even for rotary embeddings")
        if v["drafter.mask_token_id"] >= v["target.vocab_size"]:
            self.fail_at("drafter.mask_token_id",
                         f"'drafter.mask_token_id' ({v['drafter.mask_token_id']}) is outside "
                         f"the vocabulary of 'target.vocab_size' ({v['target.vocab_size']})")
        self.read_rope_scaling()
        self.read_dflash2()

    def read_rope_scaling(self):
        """[drafter.rope_scaling]: YaRN, as SpecReader::readRopeScaling."""
        if self.read_table("drafter.rope_scaling") is None:
            return
        prefix, v = "drafter.rope_scaling.", self.values
        if v[prefix + "rope_type"] != "yarn":
            self.fail_at(prefix + "rope_type",
                         f"'{prefix}rope_type' is \"{v[prefix + 'rope_type']}\"; only YaRN "
                         "(\"yarn\") is supported")
        factor = v[prefix + "factor"]
        if not factor > 1:
            self.fail_at(prefix + "factor", f"'{prefix}factor' is {factor:g}; YaRN's factor "
                                            "must be above 1")
        original = v[prefix + "original_max_position_embeddings"]
        positions = self.value("drafter.max_position_embeddings")
        if original >= positions:
            self.fail_at(prefix + "original_max_position_embeddings",
                         f"'{prefix}original_max_position_embeddings' ({original}) must be "
                         f"below 'drafter.max_position_embeddings' ({positions}): the context "
                         "YaRN extends is the shorter one")
        if v.get(prefix + "beta_fast", 32.0) < v.get(prefix + "beta_slow", 1.0):
            self.fail_at(prefix + "beta_fast",
                         f"'{prefix}beta_fast' must be at least '{prefix}beta_slow'")

    def read_dflash2(self):
        """[drafter.dflash2], as SpecReader::readDFlash2."""
        self.dflash2 = self.read_table("drafter.dflash2") is not None
        if not self.dflash2:
            return
        prefix = "drafter.dflash2."
        kc, block = self.value(prefix + "conv_kernel_size"), self.values["drafter.block_size"]
        if kc > MAX_CONV_KERNEL_SIZE:
            self.fail_at(prefix + "conv_kernel_size",
                         f"'{prefix}conv_kernel_size' is {kc}; the DFlash2 convolution kernels "
                         f"take at most {MAX_CONV_KERNEL_SIZE} taps")
        if kc > block:
            self.fail_at(prefix + "conv_kernel_size",
                         f"'{prefix}conv_kernel_size' ({kc}) is above 'drafter.block_size' "
                         f"({block}): the convolution stays inside one block, so taps past "
                         "it see nothing")
        group, hidden = self.value(prefix + "conv_group_size"), self.values["target.hidden_size"]
        if hidden % group:
            self.fail_at(prefix + "conv_group_size",
                         f"'{prefix}conv_group_size' ({group}) does not divide "
                         f"'drafter.hidden_size' ({hidden}): the channels form hidden_size / "
                         "conv_group_size groups")
        top_k, vocab = self.value(prefix + "selector_top_k"), self.values["target.vocab_size"]
        if top_k > vocab:
            self.fail_at(prefix + "selector_top_k",
                         f"'{prefix}selector_top_k' ({top_k}) is above 'target.vocab_size' "
                         f"({vocab}): the selector re-ranks the top K tokens")
        if top_k > MAX_SELECTOR_TOP_K:
            self.fail_at(prefix + "selector_top_k",
                         f"'{prefix}selector_top_k' is {top_k}; the DFlash2 selector kernels "
                         f"take at most {MAX_SELECTOR_TOP_K} candidates")

    def read_attention(self):
        count = self.values["drafter.num_layers"]
        if self.read_table("attention") is None:
            return

        def slides(kind, name):
            if kind not in ("full", "sliding"):
                self.fail_at(name, f"'{name}' is \"{kind}\"; it must be \"full\" or "
                                   "\"sliding\"")
            return kind == "sliding"

        sliding = [slides(self.value("attention.default"), "attention.default")] * count
        layers = self.values.get("attention.layers")
        if layers is not None:
            at = self.where.values.get("attention.layers")
            if not isinstance(layers, list):
                self.fail(at, "'attention.layers' must be an array of \"full\" or "
                              f"\"sliding\", not {_type_name(layers)}")
            if len(layers) != count:
                self.fail(at, f"'attention.layers' has {len(layers)} entries but "
                              f"'drafter.num_layers' is {count}")
            for i, kind in enumerate(layers):
                name = f"attention.layers.{i}"
                if not isinstance(kind, str):
                    self.fail_at(name, f"'{name}' must be \"full\" or \"sliding\", not "
                                       f"{_type_name(kind)}")
                sliding[i] = slides(kind, name)
        window = self.values.get("attention.sliding_window")
        if any(sliding) and window is None:
            self.fail_at("attention", "a layer is \"sliding\" but "
                                      "'attention.sliding_window' is not given")
        if window is not None and window <= 0:
            self.fail_at("attention.sliding_window", f"'attention.sliding_window' is "
                                                     f"{window}; a window must be positive")
        if window is not None and not any(sliding):
            self.fail_at("attention.sliding_window", "'attention.sliding_window' is given "
                                                     "but no layer is \"sliding\"")

    def read_training(self):
        self.read_table("training")
        seq_len, anchors = self.value("training.seq_len"), self.value("training.anchors_per_row")
        block = self.values["drafter.block_size"]
        if "training.gamma" not in self.values and block not in DEFAULT_GAMMA:
            self.fail_at("drafter.block_size",
                         f"'drafter.block_size' is {block}, which has no default loss decay "
                         "(7 for 16, 5 for 10, 4 for 8): give 'training.gamma' (0 turns the "
                         "decay off)")
        if anchors > seq_len - 1:
            self.fail_at("training.anchors_per_row",
                         f"'training.anchors_per_row' ({anchors}) does not fit the sequence: "
                         f"at most seq_len - 1 = {seq_len - 1} distinct anchors exist")
        positions = self.value("drafter.max_position_embeddings")
        if positions < seq_len + block:
            self.fail_at("drafter.max_position_embeddings",
                         f"'drafter.max_position_embeddings' ({positions}) is below "
                         f"seq_len + block_size ({seq_len + block})")
        self.position_buckets = self.resolve_position_buckets(seq_len, positions)
        self.read_training_dflash2()

    def resolve_position_buckets(self, seq_len, positions):
        key = "training.position_buckets"
        edges = self.values.get(key)
        if edges is None:
            return default_position_buckets(seq_len)
        if len(edges) > MAX_POSITION_BUCKETS - 1:
            self.fail_at(key, f"'{key}' has {len(edges)} edges; at most "
                              f"{MAX_POSITION_BUCKETS - 1} ({MAX_POSITION_BUCKETS} buckets) "
                              "are supported")
        for i, edge in enumerate(edges):
            name = f"{key}.{i}"
            if edge < 1:
                self.fail_at(name, f"'{name}' is {edge}; an edge must be positive")
            if i and edge <= edges[i - 1]:
                self.fail_at(name, f"'{key}' must be strictly increasing, but entry {i} "
                                   f"({edge}) follows {edges[i - 1]}")
            if edge >= positions:
                self.fail_at(name, f"'{name}' is {edge}; it must be below "
                                   f"'drafter.max_position_embeddings' ({positions})")
        # No anchor of a row of seq_len tokens reaches an edge past it.
        return [edge for edge in edges if edge < seq_len]

    def read_training_dflash2(self):
        """[training.dflash2], as SpecReader::readTrainingDFlash2."""
        table = "training.dflash2"
        node = self.data.get("training")
        node = node.get("dflash2") if isinstance(node, dict) else None
        if node is None:
            return
        if not isinstance(node, dict):
            self.fail(self.where.values.get(table),
                      f"'{table}' must be a table, not {_type_name(node)}")
        if not self.dflash2:
            self.fail_at(table, "[training.dflash2] sets the loss of a selector, but the drafter "
                                "has no selector: only a DFlash2 drafter (a [drafter.dflash2] "
                                "table) has one")
        self.read_table(table)
        prefix = table + "."
        warmup, ramp = prefix + "selector_warmup_ratio", prefix + "selector_ramp_ratio"
        if self.value(warmup) >= 1:
            self.fail_at(warmup, f"'{warmup}' must be below 1: the selector would never be "
                                 "trained")
        if self.value(ramp) > 1:
            self.fail_at(ramp, f"'{ramp}' must be at most 1")
        if self.value(warmup) + self.value(ramp) > 1:
            self.fail_at(ramp, f"'{warmup}' + '{ramp}' must be at most 1: the ramp would end "
                               "after the last step")
        gold_key, denominator_key = prefix + "selector_gold", prefix + "selector_denominator"
        gold, denominator = self.value(gold_key), self.value(denominator_key)
        if gold not in ("topk", "inject"):
            self.fail_at(gold_key, f"'{gold_key}' is \"{gold}\"; it must be \"topk\" or "
                                   "\"inject\"")
        if denominator not in ("all", "covered"):
            self.fail_at(denominator_key, f"'{denominator_key}' is \"{denominator}\"; it must "
                                          "be \"all\" or \"covered\"")
        if gold == "inject" and denominator == "covered":
            self.fail_at(denominator_key,
                         f"'{denominator_key}' = \"covered\" contradicts '{gold_key}' = "
                         "\"inject\": an injected label covers every slot (cov = 1), so "
                         "\"covered\" would divide by the same sum as \"all\"; say \"all\"")

    def read_optimizer_rules(self):
        for key, message in (("warmup_ratio", "must be below 1"), ("beta1", "must be below 1"),
                             ("beta2", "must be below 1")):
            value = self.values.get(f"optimizer.{key}")
            if value is not None and value >= 1:
                self.fail_at(f"optimizer.{key}", f"'optimizer.{key}' {message}")

    def resolve_taps(self):
        num, draft = self.values["target.num_layers"], self.values["drafter.num_layers"]
        ids = self.values.get("target.layer_ids")
        if ids is None:
            ids = default_layer_ids(num, draft)
            if any(not 0 <= t < num or (i and t <= ids[i - 1]) for i, t in enumerate(ids)):
                self.fail_at("target.num_layers",
                             f"the default taps for {draft} drafter layers over {num} target "
                             "layers are not distinct layers of the target; give "
                             "'target.layer_ids'")
        return ids


def read_spec(path, known_keys_only=True):
    """The spec at `path` read by this module alone, as strictly as
    dflashc reads it; SpecError at the first problem. `known_keys_only`
    False lets keys this copy of the schema does not know through (where
    dflashc has accepted the spec)."""
    data, text = _parse(path)
    reader = _Reader(path, data, text, known_keys_only)
    ids = reader.read()
    v = reader.value
    return Spec(path=path, name=v("name"), target_model=v("target.model"),
                target_num_layers=v("target.num_layers"),
                hidden_size=v("target.hidden_size"), vocab_size=v("target.vocab_size"),
                layer_ids=list(ids), layer_ids_defaulted="target.layer_ids" not in reader.values,
                drafter_num_layers=v("drafter.num_layers"),
                mask_token_id=v("drafter.mask_token_id"), block_size=v("drafter.block_size"),
                seq_len=v("training.seq_len"), anchors_per_row=v("training.anchors_per_row"),
                tie_word_embeddings=v("target.tie_word_embeddings"),
                position_buckets=list(reader.position_buckets), dflash2=reader.dflash2)


def find_dflashc():
    """The dflashc that checks specs: $DFLASHC (none: no dflashc), else this
    checkout's build/bin/dflashc, else one on PATH; None where there is none."""
    chosen = os.environ.get("DFLASHC")
    if chosen is not None:
        if chosen.strip().lower() in ("", "none"):
            return None
        found = shutil.which(chosen)
        if not found:
            raise UserError(f"DFLASHC={chosen}: not an executable dflashc; set DFLASHC=none "
                            "to read specs without it")
        return found
    root = os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.dirname(os.path.realpath(__file__)))))
    built = os.path.join(root, "build", "bin", "dflashc")
    if os.path.isfile(built) and os.access(built, os.X_OK):
        return built
    return shutil.which("dflashc")


def check_with_dflashc(path, dflashc):
    """True where `dflashc SPEC --emit=spec` accepts the spec; its
    diagnostics as a SpecError where it refuses it; False (with a warning)
    where it could not run."""
    try:
        result = subprocess.run([dflashc, path, "--emit=spec"], stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                timeout=120)
    except (OSError, subprocess.TimeoutExpired) as error:
        warn(f"{dflashc} could not check {path} ({error}); reading it without dflashc")
        return False
    said = result.stderr.decode("utf-8", "replace").strip()
    if result.returncode == 0:
        return True
    if result.returncode > 0 and said:
        raise SpecError(said)
    warn(f"{dflashc} could not check {path} (exit status {result.returncode}"
         + (f": {said}" if said else "") + "); reading it without dflashc")
    return False


def load_spec(path):
    """The spec at `path`, checked by dflashc where one is at hand (its
    diagnostics passed through), read by read_spec."""
    dflashc = find_dflashc()
    accepted = check_with_dflashc(path, dflashc) if dflashc else False
    return read_spec(path, known_keys_only=not accepted)
