"""template.py's spans and masks with a stand-in tokenizer (no transformers):
it renders the toy Qwen-style templates in Python, as jinja would, and
splits text into words, single characters and special tokens."""
import re
import unittest

import numpy as np

from helpers import TempDir

from dflash_prepare import chat, template, toy
from dflash_prepare.errors import UserError

SPECIAL = ["<|im_start|>", "<|im_end|>", "<|endoftext|>"]
PIECES = re.compile("|".join(re.escape(s) for s in SPECIAL) + r"|\w+|\s|[^\w\s]")


class FakeTokenizer:
    eos_token = "<|im_end|>"
    mask_token_id = None
    mask_token = None
    all_special_ids = [0, 1, 2]

    def __init__(self):
        self.vocab = {s: i for i, s in enumerate(SPECIAL)}
        self.added_tokens_decoder = {i: s for i, s in enumerate(SPECIAL)}

    def __len__(self):
        return 60

    def convert_ids_to_tokens(self, i):
        return {v: k for k, v in self.vocab.items()}.get(i, f"t{i}")

    def apply_chat_template(self, messages, tools=None, tokenize=False,
                            add_generation_prompt=False, chat_template=None):
        marked = "\ue000" in chat_template
        last_only = "loop.last" in chat_template
        open_, close = ("\ue000", "\ue001") if marked else ("", "")
        text = ""
        for index, m in enumerate(messages):
            if m["role"] == "assistant":
                text += "<|im_start|>assistant\n" + open_
                if m.get("reasoning_content") and (not last_only or index == len(messages) - 1):
                    text += "<think>\n" + m["reasoning_content"] + "\n</think>\n\n"
                text += m["content"] + "<|im_end|>" + close + "\n"
            else:
                if m["role"] == "bad":
                    raise ValueError("Unknown role in template")
                text += "<|im_start|>" + m["role"] + "\n" + m["content"] + "<|im_end|>\n"
        if add_generation_prompt:
            text += "<|im_start|>assistant\n"
        return text

    def __call__(self, text, add_special_tokens=False, return_offsets_mapping=False):
        ids, offsets = [], []
        for match in PIECES.finditer(text):
            ids.append(self.vocab.setdefault(match.group(), len(self.vocab)))
            offsets.append(match.span())
        assert "".join(text[s:e] for s, e in offsets) == text
        return {"input_ids": ids, "offset_mapping": offsets}


CONVERSATION = [
    {"role": "system", "content": "be brief"},
    {"role": "user", "content": "say hi"},
    {"role": "assistant", "content": "hi there", "reasoning_content": "easy"},
    {"role": "tool", "content": "result 1"},
    {"role": "user", "content": "again"},
    {"role": "assistant", "content": "hi again"},
]


def supervised_text(tokenizer, text, encoded):
    pieces = [m.group() for m in PIECES.finditer(text)]
    assert len(pieces) == len(encoded.ids)
    return "".join(p for p, m in zip(pieces, encoded.mask) if m)


class TemplateTest(TempDir):
    def encode(self, chat_template, messages=CONVERSATION, last_turn_only=False):
        tokenizer = FakeTokenizer()
        encoder = template.ChatEncoder(tokenizer, chat_template, "tok", last_turn_only)
        conversation = chat.Conversation(messages, "chat.jsonl:1")
        encoded = encoder.encode(conversation)
        text = encoder.render(messages, False)
        return encoder, encoded, supervised_text(tokenizer, text, encoded)

    def test_markers_and_prefixes_supervise_the_same_tokens(self):
        expected = "<think>\neasy\n</think>\n\nhi there<|im_end|>hi again<|im_end|>"
        marked, a, text_a = self.encode(toy.QWEN_STYLE_TEMPLATE)
        plain, b, text_b = self.encode(toy.QWEN_STYLE_TEMPLATE_PLAIN)
        self.assertEqual(marked.method, "generation-markers")
        self.assertEqual(plain.method, "prefixes")
        self.assertEqual(text_a, expected)
        np.testing.assert_array_equal(a.ids, b.ids)
        np.testing.assert_array_equal(a.mask, b.mask)

    def test_last_turn_only(self):
        for chat_template in (toy.QWEN_STYLE_TEMPLATE, toy.QWEN_STYLE_TEMPLATE_PLAIN):
            _, _, text = self.encode(chat_template, last_turn_only=True)
            self.assertEqual(text, "hi again<|im_end|>")

    def test_a_template_without_the_prefix_property_is_refused(self):
        with self.assertRaises(template.PrefixPropertyError) as caught:
            self.encode(toy.QWEN_STYLE_TEMPLATE_LAST_REASONING)
        message = str(caught.exception)
        self.assertIn("tok: the chat template does not render conversations incrementally", message)
        self.assertIn("chat.jsonl:1, turn 2", message)
        self.assertIn("--last-turn-only", message)
        # Only the last turn's prefix is needed then, and it holds.
        _, _, text = self.encode(toy.QWEN_STYLE_TEMPLATE_LAST_REASONING, last_turn_only=True)
        self.assertEqual(text, "hi again<|im_end|>")

    def test_template_failure_is_per_conversation(self):
        with self.assertRaises(template.TemplateFailure) as caught:
            self.encode(toy.QWEN_STYLE_TEMPLATE, [{"role": "bad", "content": "x"},
                                                  {"role": "assistant", "content": "y"}])
        self.assertIn("Unknown role in template", str(caught.exception))

    def test_spans_to_mask_overlap_rule(self):
        offsets = np.array([[0, 3], [3, 5], [5, 5], [5, 9], [9, 12]])
        np.testing.assert_array_equal(template.spans_to_mask(offsets, [(4, 9)]), [0, 1, 1, 1, 0])
        np.testing.assert_array_equal(template.spans_to_mask(offsets, [(0, 3), (9, 10)]),
                                      [1, 0, 0, 0, 1])
        np.testing.assert_array_equal(template.spans_to_mask(offsets, [(3, 3)]), [0] * 5)

    def test_sentinel_template_keeps_whitespace_control(self):
        marked = template._sentinel_template("a {%- generation -%} b {%- endgeneration %} c")
        self.assertEqual(marked, "a {%- if true %}{{ '\ue000' }}{% if true -%} b "
                                 "{%- endif %}{{ '\ue001' }}{% endif %} c")

    def test_mask_token_checks(self):
        spec = self.spec
        tokenizer = FakeTokenizer()
        lines = template.check_mask_token(tokenizer, spec, "tok")
        self.assertEqual(lines, ["mask_token_id 63: an embedding row past the tokenizer's 60 "
                                 "tokens (never produced by it)"])
        spec.mask_token_id = 1
        self.assertIn("the tokenizer's special token '<|im_end|>'",
                      template.check_mask_token(tokenizer, spec, "tok")[0])
        spec.mask_token_id = 40
        self.assertIn("the regular token 't40'", template.check_mask_token(tokenizer, spec, "tok")[0])
        spec.vocab_size = 50
        with self.assertRaises(UserError) as caught:
            template.check_mask_token(tokenizer, spec, "tok")
        self.assertIn("tok: the tokenizer has 60 tokens but", str(caught.exception))
        self.assertIn("[target] vocab_size is 50", str(caught.exception))


if __name__ == "__main__":
    unittest.main()
