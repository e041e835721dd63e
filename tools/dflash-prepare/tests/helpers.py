"""Shared pieces of the dflash-prepare tests: the checkout's packages, small
specs, shard builders, and what the optional packages allow. Import it
before dflash_prepare or dflash_plot."""
import errno
import importlib
import importlib.util
import os
import re
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
TOOL_DIR = os.path.dirname(HERE)
ROOT = os.path.dirname(os.path.dirname(TOOL_DIR))
PLOT_DIR = os.path.join(ROOT, "tools", "dflash-plot")
SPECS = os.path.join(ROOT, "specs")
PREPARE = os.path.join(TOOL_DIR, "dflash-prepare")
PLOT = os.path.join(PLOT_DIR, "dflash-plot")


def import_from_checkout(name, directory):
    """Imports package `name` from `directory` by its location, as the
    launchers do: the tests run this checkout's code whether or not the
    tools are installed, and sys.path is left as it is. A package already
    imported is kept."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(
        name, os.path.join(directory, name, "__init__.py"))
    package = importlib.util.module_from_spec(spec)
    sys.modules[name] = package
    spec.loader.exec_module(package)
    return package


import_from_checkout("dflash_prepare", TOOL_DIR)
import_from_checkout("dflash_plot", PLOT_DIR)

import numpy as np  # noqa: E402

from dflash_prepare import shards  # noqa: E402
from dflash_prepare.spec import load_spec  # noqa: E402


def _importable(*names):
    try:
        for name in names:
            importlib.import_module(name)
        return True
    except Exception:
        return False


def has_hf():
    """transformers, tokenizers and torch >= 2: the tests with a real
    tokenizer or model run only then."""
    if not _importable("transformers", "tokenizers", "torch"):
        return False
    import torch
    return int(torch.__version__.split(".")[0]) >= 2


HAS_HF = has_hf()
HAS_MATPLOTLIB = _importable("matplotlib")

SMALL_SPEC = """\
name = "small"
[target]
model = "test/small-target"
num_layers = 4
hidden_size = 8
vocab_size = 64
layer_ids = [0, 2]
[drafter]
num_layers = 2
intermediate_size = 16
num_heads = 2
num_kv_heads = 1
head_dim = 4
block_size = 4
mask_token_id = 63
[training]
seq_len = {seq_len}
gamma = 0.0
anchors_per_row = 3
"""


class TempDir(unittest.TestCase):
    """A test case with a fresh directory `self.dir` and the small spec."""

    seq_len = 16

    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory(prefix="dflash-prepare-test-")
        self.dir = self._tmp.name
        self.spec_path = self.write_spec(SMALL_SPEC.format(seq_len=self.seq_len))
        self.spec = load_spec(self.spec_path)

    def tearDown(self):
        self._tmp.cleanup()

    def path(self, *names):
        return os.path.join(self.dir, *names)

    def write_spec(self, text, name="small.toml"):
        path = self.path(name)
        with open(path, "w") as f:
            f.write(text)
        return path

    def write_file(self, name, text):
        path = self.path(name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        return path


def conversation(length, supervised_from, token=5, supervised_to=None):
    """(ids, mask) of a fake conversation: `length` tokens, supervised from
    `supervised_from` to `supervised_to` (default: the end)."""
    ids = (np.arange(length, dtype=np.int32) % 50 + token).astype(np.int32)
    mask = np.zeros(length, dtype=np.uint8)
    mask[supervised_from:supervised_to] = 1
    return ids, mask


def token_tensors(rows, packed):
    tensors = {
        "input_ids": shards.Tensor("I32", rows.input_ids),
        "loss_mask": shards.Tensor("U8", rows.loss_mask),
        "num_tokens": shards.Tensor("I32", rows.num_tokens),
    }
    if packed:
        tensors["position_ids"] = shards.Tensor("I32", rows.position_ids)
    return tensors


def feature_tensors(rows, spec, packed, seed=0):
    """Token tensors plus bf16 features: random on real tokens, zero on padding."""
    tensors = token_tensors(rows, packed)
    rng = np.random.default_rng(seed)
    R, S = rows.input_ids.shape
    values = rng.standard_normal((R, S, spec.context_width)).astype(np.float32)
    for r in range(R):
        values[r, rows.num_tokens[r]:] = 0
    tensors["hidden_states"] = shards.Tensor("BF16", shards.float32_to_bf16_bits(values))
    return tensors


def run_tool(script, *args, env=None, python=None):
    """Runs a tool script; returns (returncode, stdout, stderr). The
    launchers run in `python` (this one), not in a data environment of the
    checkout (DFLASH_DATA_VENV=none), unless `env` says otherwise."""
    full_env = dict(os.environ, DFLASH_DATA_VENV="none")
    if env:
        full_env.update(env)
    result = subprocess.run([python or sys.executable, script, *args],
                            capture_output=True, text=True, env=full_env, timeout=600)
    return result.returncode, result.stdout, result.stderr


class PieceTokenizer:
    """A stand-in fast tokenizer (no transformers): special tokens whole,
    then words, single whitespace characters and single other characters,
    with character offsets."""

    def __init__(self, specials):
        self.vocab = {s: i for i, s in enumerate(specials)}
        self.pieces = re.compile("|".join(re.escape(s) for s in
                                          sorted(specials, key=len, reverse=True))
                                 + r"|\w+|\s|[^\w\s]")

    def __call__(self, text, add_special_tokens=False, return_offsets_mapping=False):
        ids, offsets = [], []
        for match in self.pieces.finditer(text):
            ids.append(self.vocab.setdefault(match.group(), len(self.vocab)))
            offsets.append(match.span())
        assert "".join(text[s:e] for s, e in offsets) == text
        return {"input_ids": ids, "offset_mapping": offsets}

    def pieces_of(self, text):
        return [m.group() for m in self.pieces.finditer(text)]


class FakeChatTokenizer:
    """What `tokens` reads of a transformers tokenizer, without transformers:
    the toy Qwen-style template rendered with jinja2, and pieces (special
    tokens whole, words, single characters) with fixed ids below 57, so that
    any process gives the same ids. Like the Rust tokenizers, it cannot take
    a string with a lone surrogate. Stands in for template.load_tokenizer's
    result (tests/test_tokens_cpu.py)."""

    is_fast = True
    pad_token_id, eos_token_id, eos_token = 0, 2, "<|im_end|>"
    mask_token_id = mask_token = None
    name_or_path = "fake-chat-tokenizer"

    def __init__(self):
        from dflash_prepare import toy
        self.specials = list(toy.SPECIAL_TOKENS)
        self.chat_template = toy.QWEN_STYLE_TEMPLATE
        self.all_special_ids = list(range(len(self.specials)))
        self.added_tokens_decoder = dict(enumerate(self.specials))
        self.pieces = re.compile("|".join(re.escape(s) for s in self.specials)
                                 + r"|\w+|\s|[^\w\s]")

    def __len__(self):
        return 60

    def convert_ids_to_tokens(self, i):
        return self.specials[i] if i < len(self.specials) else f"t{i}"

    def apply_chat_template(self, messages, tools=None, tokenize=False,
                            add_generation_prompt=False, chat_template=None, **options):
        if not hasattr(self, "renderer"):
            from dflash_prepare import render
            self.renderer = render.JinjaRenderer(self.chat_template, {})  # compiles once
        return self.renderer.render(messages, tools, add_generation_prompt,
                                    template=chat_template, **options)

    def __call__(self, text, add_special_tokens=False, return_offsets_mapping=False):
        ids, offsets = [], []
        for match in self.pieces.finditer(text):
            piece = match.group()
            ids.append(self.specials.index(piece) if piece in self.specials
                       else len(self.specials) + sum(piece.encode("utf-8")) % 50)
            offsets.append(match.span())
        return {"input_ids": ids, "offset_mapping": offsets}


class FullDisk:
    """A file that takes `room` bytes and then fails as a full disk does
    (ENOSPC), for a test's stand-in `open`."""

    def __init__(self, file, room):
        self.file, self.room = file, room

    def write(self, data):
        data = memoryview(data).cast("B")
        if len(data) > self.room:
            self.file.write(data[:self.room])
            self.room = 0
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self.room -= len(data)
        return self.file.write(data)

    def __getattr__(self, name):
        return getattr(self.file, name)
