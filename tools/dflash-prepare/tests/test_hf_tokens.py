"""`tokens` with a real tokenizer: a byte-level BPE trained here with the
`tokenizers` library, wrapped as a PreTrainedTokenizerFast with the toy
Qwen-style template. Skipped without transformers/tokenizers/torch >= 2."""
import json
import os
import shutil
import tempfile
import unittest

import numpy as np

from helpers import HAS_HF, PREPARE, run_tool

from dflash_prepare import chat, packing, shards, spans, template, toy

# Hand-written turns of every kind: system, user, assistant with reasoning,
# a tool call and its result, and plain answers.
CONVERSATIONS = [
    [{"role": "system", "content": "You are a helpful assistant."},
     {"role": "user", "content": "reverse: red blue green"},
     {"role": "assistant", "content": "green blue red",
      "reasoning_content": "The user wants the same words, last first."},
     {"role": "user", "content": "upper: cat dog"},
     {"role": "assistant", "content": "CAT DOG"}],
    [{"role": "user", "content": "what does apple mean?"},
     {"role": "assistant", "content": "",
      "tool_calls": [{"type": "function",
                      "function": {"name": "lookup", "arguments": {"word": "apple"}}}]},
     {"role": "tool", "content": "apple: a common word"},
     {"role": "assistant", "content": "apple is a common word."}],
    [{"role": "user", "content": "count from 3 to 7"},
     {"role": "assistant", "content": "3 4 5 6 7"},
     {"role": "user", "content": "thanks"},
     {"role": "assistant", "content": "You are welcome."}],
]

SPEC = """\
name = "hf-test"
[target]
model = "test/toy-qwen3"
num_layers = 4
hidden_size = 64
vocab_size = 1024
layer_ids = [0, 2]
[drafter]
num_layers = 2
intermediate_size = 128
num_heads = 2
num_kv_heads = 1
head_dim = 32
block_size = 4
mask_token_id = 1023
[training]
seq_len = {seq_len}
gamma = 0.0
anchors_per_row = 8
"""


def expected_generated(message):
    """What the toy template puts between its generation markers."""
    text = ""
    if message.get("reasoning_content"):
        text += "<think>\n" + message["reasoning_content"] + "\n</think>\n\n"
    text += message["content"]
    for call in message.get("tool_calls") or []:
        text += "\n<tool_call>\n" + json.dumps(call["function"], ensure_ascii=False) + "\n</tool_call>"
    return text + "<|im_end|>"


@unittest.skipUnless(HAS_HF, "needs transformers, tokenizers and torch >= 2")
class RealTokenizerTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="dflash-prepare-hf-")
        cls.tokenizer_dir = os.path.join(cls.tmp, "tokenizer")
        records = toy.make_corpus(300, seed=0) + [{"messages": c} for c in CONVERSATIONS]
        toy.build_tokenizer(cls.tokenizer_dir, toy.corpus_texts(records), vocab_size=1000)
        cls.tokenizer = template.load_tokenizer(cls.tokenizer_dir)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def setUp(self):
        self.dir = tempfile.mkdtemp(dir=self.tmp)

    def spec(self, seq_len=256, **replace):
        text = SPEC.format(seq_len=seq_len)
        for old, new in replace.items():
            text = text.replace(old, new)
        path = os.path.join(self.dir, "spec.toml")
        with open(path, "w") as f:
            f.write(text)
        return path

    def encoder(self, chat_template=toy.QWEN_STYLE_TEMPLATE, last_turn_only=False):
        return template.ChatEncoder(
            self.tokenizer, template.TokenizerRenderer(self.tokenizer, chat_template),
            spans.SpanSettings(template.end_of_turn_tokens(self.tokenizer_dir), last_turn_only))

    def test_saved_tokenizer(self):
        self.assertLessEqual(len(self.tokenizer), 1000)
        self.assertEqual(template.chat_template_of(self.tokenizer, self.tokenizer_dir),
                         toy.QWEN_STYLE_TEMPLATE)
        # Special tokens are single tokens, never split, also inside text.
        for special in toy.SPECIAL_TOKENS:
            ids = self.tokenizer(special, add_special_tokens=False)["input_ids"]
            self.assertEqual(len(ids), 1, special)
            inside = self.tokenizer(f"red{special}blue", add_special_tokens=False)["input_ids"]
            self.assertIn(ids[0], inside)

    def test_exactly_the_assistant_tokens_are_supervised(self):
        encoder = self.encoder()
        for index, messages in enumerate(CONVERSATIONS):
            conversation = chat.Conversation(messages, f"hand:{index}")
            encoded = encoder.encode(conversation)
            text = encoder.renderer.render(messages)
            # The expected spans, found in the rendered text independently.
            spans, at = [], 0
            for message in messages:
                if message["role"] != "assistant":
                    continue
                header = text.index("<|im_start|>assistant\n", at) + len("<|im_start|>assistant\n")
                generated = expected_generated(message)
                self.assertEqual(text[header:header + len(generated)], generated)
                spans.append((header, header + len(generated)))
                at = header + len(generated)
            offsets = self.tokenizer(text, add_special_tokens=False,
                                     return_offsets_mapping=True)["offset_mapping"]
            self.assertEqual(len(offsets), len(encoded.ids))
            for t, (start, end) in enumerate(offsets):
                inside = any(s <= start and end <= e for s, e in spans)
                outside = all(end <= s or start >= e for s, e in spans)
                self.assertTrue(inside or outside, f"token {t} straddles a span")
                self.assertEqual(bool(encoded.mask[t]), inside,
                                 f"conversation {index}, token {t} {text[start:end]!r}")
            supervised = "".join(text[s:e] for (s, e), m in zip(offsets, encoded.mask) if m)
            self.assertEqual(supervised, "".join(text[s:e] for s, e in spans))
            # The ids are those of the tokenizer on the whole render.
            self.assertEqual(list(encoded.ids),
                             self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def test_agrees_with_transformers_own_assistant_mask(self):
        for messages in CONVERSATIONS:
            try:
                out = self.tokenizer.apply_chat_template(
                    messages, tokenize=True, return_dict=True,
                    return_assistant_tokens_mask=True)
            except TypeError as error:
                self.skipTest(f"this transformers has no assistant mask: {error}")
            ours = self.encoder().encode(chat.Conversation(messages, "hand"))
            self.assertEqual(list(ours.ids), list(out["input_ids"]))
            self.assertEqual(list(ours.mask), list(out["assistant_masks"]))

    def test_sentinels_give_the_markers_mask(self):
        for messages in CONVERSATIONS:
            conversation = chat.Conversation(messages, "hand")
            a = self.encoder().encode(conversation)
            b = self.encoder(toy.QWEN_STYLE_TEMPLATE_PLAIN).encode(conversation)
            self.assertEqual((a.spans.method, b.spans.method), ("generation-markers", "sentinels"))
            np.testing.assert_array_equal(a.ids, b.ids)
            np.testing.assert_array_equal(a.mask, b.mask)
            last_a = self.encoder(last_turn_only=True).encode(conversation)
            last_b = self.encoder(toy.QWEN_STYLE_TEMPLATE_PLAIN, True).encode(conversation)
            np.testing.assert_array_equal(last_a.mask, last_b.mask)
            # Only the last turn: the tail of the full mask.
            last_start = int(np.flatnonzero(np.diff(np.r_[0, a.mask]) == 1)[-1])
            expected = a.mask.copy()
            expected[:last_start] = 0
            np.testing.assert_array_equal(last_a.mask, expected)

    def test_template_that_rewrites_history(self):
        # Earlier turns' reasoning is dropped from the render: still read
        # from the one full render, the reasoning left out of the mask.
        encoded = self.encoder(toy.QWEN_STYLE_TEMPLATE_LAST_REASONING).encode(
            chat.Conversation(CONVERSATIONS[0], "hand:0"))
        self.assertEqual(encoded.spans.method, "sentinels")
        supervised = [encoded.spans.text[s:e] for s, e in encoded.spans.spans]
        self.assertEqual(supervised, ["green blue red<|im_end|>", "CAT DOG<|im_end|>"])

    def fitting(self, data, length):
        """How many conversations of `data` encode to at most `length` tokens."""
        encoder = self.encoder()
        return sum(len(encoder.encode(c).ids) <= length
                   for c in chat.read_conversations([data], chat.Drops()))

    def write_data(self, extra_lines=()):
        path = os.path.join(self.dir, "chat.jsonl")
        records = [{"messages": c} for c in CONVERSATIONS] + toy.make_corpus(60, seed=5)
        toy.write_jsonl(path, records)
        with open(path, "a") as f:
            for line in extra_lines:
                f.write(line + "\n")
        return path, len(records)

    def tokens(self, *args):
        return run_tool(PREPARE, "tokens", *args)

    def test_tokens_pack_check_and_resume(self):
        long_answer = " ".join(["apple"] * 400)
        data, good = self.write_data([
            "{broken",
            json.dumps({"messages": [{"role": "user", "content": "hello"}]}),
            json.dumps({"messages": [{"role": "user", "content": "q"},
                                     {"role": "wizard", "content": "a"}]}),
            json.dumps({"messages": [{"role": "user", "content": "q"},
                                     {"role": "assistant", "content": long_answer}]}),
        ])
        spec = self.spec()
        out = os.path.join(self.dir, "tokens")
        status, stdout, stderr = self.tokens(data, "--spec", spec, "--tokenizer",
                                             self.tokenizer_dir, "--out", out, "--pack",
                                             "--rows-per-shard", "8")
        self.assertEqual(status, 0, stderr)
        self.assertIn(f"dropped {data}:{good + 1}: malformed json", stderr)
        self.assertIn(f"dropped {data}:{good + 2}: 1 turns, none of them the assistant's", stderr)
        self.assertIn(f"dropped {data}:{good + 3}: turn 1 has unknown role 'wizard'", stderr)
        self.assertIn(f"dropped {data}:{good + 4}: ", stderr)
        self.assertIn("more than --max-length 256", stderr)
        fitting = self.fitting(data, 256)
        self.assertIn("loss masks from the one full render of each conversation (the "
                      "template's generation markers); end of turn: <|im_end|>", stderr)
        self.assertIn("mask_token_id 1023: an embedding row past the tokenizer's", stderr)
        over = good + 1 - fitting
        self.assertIn(f"dropped {3 + over} of {good + 4}: malformed json line 1, unknown role 1, "
                      f"no assistant turn 1, over-long (--max-length) {over}", stderr)
        self.assertIn(f"{fitting} conversations", stdout)

        status, stdout, stderr = run_tool(PREPARE, "check", out, "--spec", spec)
        self.assertEqual(status, 0, stdout + stderr)

        paths = shards.list_shards(out)
        self.assertGreater(len(paths), 1)
        first = shards.SafetensorsFile(paths[0])
        meta = first.metadata
        self.assertEqual(meta["packed"], "true")
        self.assertEqual(meta["chat_template"], toy.QWEN_STYLE_TEMPLATE)
        self.assertEqual(meta["chat_template_sha256"],
                         template.template_sha256(toy.QWEN_STYLE_TEMPLATE))
        self.assertEqual(meta["tokenizer_vocab_size"], str(len(self.tokenizer)))
        self.assertEqual(json.loads(meta["loss_mask_from"]), {"generation-markers": fitting})
        self.assertEqual((meta["target"], meta["target_layer_ids"], meta["seq_len"]),
                         ("test/toy-qwen3", "[0, 2]", "256"))

        # Every packed conversation is exactly its own encoding.
        encoder = self.encoder()
        expected = {}
        drops = chat.Drops()
        for c in chat.read_conversations([data], drops):
            e = encoder.encode(c)
            if len(e.ids) <= 256:
                expected.setdefault(tuple(e.ids), []).append(tuple(e.mask))
        found = 0
        for path in paths:
            shard = shards.SafetensorsFile(path)
            ids, mask = shard.load("input_ids"), shard.load("loss_mask")
            pos, n = shard.load("position_ids"), shard.load("num_tokens")
            for r in range(len(n)):
                for s, e in packing.conversation_bounds(pos[r], n[r]):
                    self.assertIn(tuple(mask[r, s:e]), expected[tuple(ids[r, s:e])])
                    found += 1
                self.assertTrue((mask[r, n[r]:] == 0).all())
        self.assertEqual(found, fitting)

        # Done: a second run does nothing.
        status, stdout, stderr = self.tokens(data, "--spec", spec, "--tokenizer",
                                             self.tokenizer_dir, "--out", out, "--pack",
                                             "--rows-per-shard", "8")
        self.assertEqual(status, 0, stderr)
        self.assertIn("already complete", stderr)
        # Interrupted after the first shard: the rest is written again, the
        # same bytes.
        with open(paths[-1], "rb") as f:
            last_bytes = f.read()
        os.remove(paths[-1])
        manifest_path = os.path.join(out, "manifest.json")
        with open(manifest_path) as f:
            manifest = json.load(f)
        manifest["complete"] = False
        with open(manifest_path, "w") as f:
            json.dump(manifest, f)
        status, stdout, stderr = self.tokens(data, "--spec", spec, "--tokenizer",
                                             self.tokenizer_dir, "--out", out, "--pack",
                                             "--rows-per-shard", "8")
        self.assertEqual(status, 0, stderr)
        self.assertIn(f"wrote 1 shard(s), kept {len(paths) - 1} complete", stderr)
        with open(paths[-1], "rb") as f:
            self.assertEqual(f.read(), last_bytes)
        # Other options are another run: refused without --overwrite.
        status, _, stderr = self.tokens(data, "--spec", spec, "--tokenizer",
                                        self.tokenizer_dir, "--out", out)
        self.assertEqual(status, 2)
        self.assertIn("holds the shards of a different run", stderr)

    def test_unpacked_truncated_last_turn(self):
        data, good = self.write_data([json.dumps({"messages": [
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": " ".join(["apple"] * 400)}]})])
        spec = self.spec()
        out = os.path.join(self.dir, "tokens")
        over = good + 1 - self.fitting(data, 200)
        status, stdout, stderr = self.tokens(data, "--spec", spec, "--tokenizer",
                                             self.tokenizer_dir, "--out", out,
                                             "--over-long", "truncate", "--last-turn-only",
                                             "--max-length", "200")
        self.assertEqual(status, 0, stderr)
        self.assertIn(f"truncated {over} over-long (--over-long truncate)", stderr)
        shard = shards.SafetensorsFile(shards.list_shards(out)[0])
        self.assertNotIn("position_ids", shard.tensors)
        self.assertEqual(shard.metadata["packed"], "false")
        self.assertEqual(shard.metadata["last_turn_only"], "true")
        n = shard.load("num_tokens")
        self.assertEqual(len(n), good + 1)
        self.assertEqual(int(n.max()), 200)
        status, stdout, _ = run_tool(PREPARE, "check", out, "--spec", spec)
        self.assertEqual(status, 0, stdout)

    def test_mask_token_produced_by_the_data_is_an_error(self):
        data, _ = self.write_data()
        apple = self.tokenizer("apple", add_special_tokens=False)["input_ids"]
        self.assertEqual(len(apple), 1)
        spec = self.spec(**{"mask_token_id = 1023": f"mask_token_id = {apple[0]}"})
        status, _, stderr = self.tokens(data, "--spec", spec, "--tokenizer", self.tokenizer_dir,
                                        "--out", os.path.join(self.dir, "t"))
        self.assertEqual(status, 2)
        self.assertIn("is the tokenizer's regular token", stderr)
        self.assertIn(f"mask_token_id {apple[0]} is produced by the tokenizer on the data", stderr)
        small = self.spec(**{"vocab_size = 1024": "vocab_size = 300",
                             "mask_token_id = 1023": "mask_token_id = 299"})
        status, _, stderr = self.tokens(data, "--spec", small, "--tokenizer", self.tokenizer_dir,
                                        "--out", os.path.join(self.dir, "t2"))
        self.assertEqual(status, 2)
        self.assertIn("tokens but", stderr)
        self.assertIn("[target] vocab_size is 300", stderr)

    def test_reasoning_drop_removes_think(self):
        data, _ = self.write_data()
        out = os.path.join(self.dir, "t")
        status, _, stderr = self.tokens(data, "--spec", self.spec(), "--tokenizer",
                                        self.tokenizer_dir, "--out", out, "--reasoning", "drop")
        self.assertEqual(status, 0, stderr)
        think = self.tokenizer.convert_tokens_to_ids("<think>")
        ids = shards.SafetensorsFile(shards.list_shards(out)[0]).load("input_ids")
        self.assertFalse((ids == think).any())

    def test_tokenizer_problems(self):
        data, _ = self.write_data()
        empty = os.path.join(self.dir, "empty")
        os.makedirs(empty)
        status, _, stderr = self.tokens(data, "--spec", self.spec(), "--tokenizer", empty,
                                        "--out", os.path.join(self.dir, "t"))
        self.assertEqual(status, 2)
        self.assertIn(f"{empty}: cannot load a tokenizer", stderr)
        self.assertNotIn("Traceback", stderr)
        bare = os.path.join(self.dir, "bare")
        shutil.copytree(self.tokenizer_dir, bare)
        for name in os.listdir(bare):
            if name.endswith(".jinja"):
                os.remove(os.path.join(bare, name))
        config_path = os.path.join(bare, "tokenizer_config.json")
        with open(config_path) as f:
            config = json.load(f)
        config.pop("chat_template", None)
        with open(config_path, "w") as f:
            json.dump(config, f)
        status, _, stderr = self.tokens(data, "--spec", self.spec(), "--tokenizer", bare,
                                        "--out", os.path.join(self.dir, "t3"))
        self.assertEqual(status, 2)
        self.assertIn("the tokenizer has no chat template", stderr)


if __name__ == "__main__":
    unittest.main()
