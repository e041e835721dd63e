"""template.py's and spans.py's masks on the toy Qwen-style templates,
rendered with jinja2 (as transformers renders them) and split by a
stand-in tokenizer (no transformers)."""
import unittest

import numpy as np

from helpers import PieceTokenizer, TempDir

from dflash_prepare import chat, render, spans, template, toy
from dflash_prepare.errors import UserError

SPECIAL = ["<|im_start|>", "<|im_end|>", "<|endoftext|>"]
SPECIAL_TOKENS = {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}

CONVERSATION = [
    {"role": "system", "content": "be brief"},
    {"role": "user", "content": "say hi"},
    {"role": "assistant", "content": "hi there", "reasoning_content": "easy"},
    {"role": "tool", "content": "result 1"},
    {"role": "user", "content": "again"},
    {"role": "assistant", "content": "hi again"},
]

# A template that refuses a role of its own accord (raise_exception).
REFUSING_TEMPLATE = ("{%- if messages[0].role == 'bad' %}"
                     "{{- raise_exception('Unknown role in template') }}{%- endif %}"
                     + toy.QWEN_STYLE_TEMPLATE)


class FakeTokenizer:
    """What check_mask_token reads of a tokenizer."""
    eos_token = "<|im_end|>"
    mask_token_id = None
    mask_token = None
    all_special_ids = [0, 1, 2]
    added_tokens_decoder = {i: s for i, s in enumerate(SPECIAL)}

    def __len__(self):
        return 60

    def convert_ids_to_tokens(self, i):
        return SPECIAL[i] if i < len(SPECIAL) else f"t{i}"


class TemplateTest(TempDir):
    def encode(self, chat_template, messages=CONVERSATION, last_turn_only=False):
        tokenizer = PieceTokenizer(SPECIAL)
        renderer = render.JinjaRenderer(chat_template, SPECIAL_TOKENS)
        settings = spans.SpanSettings(["<|im_end|>"], last_turn_only)
        encoder = template.ChatEncoder(tokenizer, renderer, settings)
        encoded = encoder.encode(chat.Conversation(messages, "chat.jsonl:1"))
        pieces = tokenizer.pieces_of(encoded.spans.text)
        self.assertEqual(len(pieces), len(encoded.ids))
        supervised = "".join(p for p, m in zip(pieces, encoded.mask) if m)
        return encoded, supervised

    def test_markers_and_sentinels_supervise_the_same_tokens(self):
        expected = "<think>\neasy\n</think>\n\nhi there<|im_end|>hi again<|im_end|>"
        a, text_a = self.encode(toy.QWEN_STYLE_TEMPLATE)
        b, text_b = self.encode(toy.QWEN_STYLE_TEMPLATE_PLAIN)
        self.assertEqual(a.spans.method, "generation-markers")
        self.assertEqual(b.spans.method, "sentinels")
        self.assertEqual(text_a, expected)
        np.testing.assert_array_equal(a.ids, b.ids)
        np.testing.assert_array_equal(a.mask, b.mask)
        self.assertEqual((b.spans.turns, b.spans.supervised, b.spans.without_end), (2, 2, 0))

    def test_last_turn_only(self):
        for chat_template in (toy.QWEN_STYLE_TEMPLATE, toy.QWEN_STYLE_TEMPLATE_PLAIN):
            encoded, text = self.encode(chat_template, last_turn_only=True)
            self.assertEqual(text, "hi again<|im_end|>")
            self.assertEqual((encoded.spans.turns, encoded.spans.supervised), (2, 1))

    def test_a_template_that_rewrites_history(self):
        # Reasoning is shown on the last turn only, so no partial render is a
        # prefix of the whole one; the spans come from the full render.
        encoded, text = self.encode(toy.QWEN_STYLE_TEMPLATE_LAST_REASONING)
        self.assertEqual(encoded.spans.method, "sentinels")
        self.assertEqual(text, "hi there<|im_end|>hi again<|im_end|>")
        last = CONVERSATION[:-1] + [dict(CONVERSATION[-1], reasoning_content="hm")]
        _, text = self.encode(toy.QWEN_STYLE_TEMPLATE_LAST_REASONING, last)
        self.assertEqual(text, "hi there<|im_end|><think>\nhm\n</think>\n\nhi again<|im_end|>")

    def test_template_failure_is_per_conversation(self):
        with self.assertRaises(template.TemplateFailure) as caught:
            self.encode(REFUSING_TEMPLATE, [{"role": "bad", "content": "x"},
                                            {"role": "assistant", "content": "y"}])
        self.assertIn("Unknown role in template", str(caught.exception))

    def test_spans_to_mask_overlap_rule(self):
        offsets = np.array([[0, 3], [3, 5], [5, 5], [5, 9], [9, 12]])
        np.testing.assert_array_equal(template.spans_to_mask(offsets, [(4, 9)]), [0, 1, 1, 1, 0])
        np.testing.assert_array_equal(template.spans_to_mask(offsets, [(0, 3), (9, 10)]),
                                      [1, 0, 0, 0, 1])
        np.testing.assert_array_equal(template.spans_to_mask(offsets, [(3, 3)]), [0] * 5)

    def test_generation_markers_keep_whitespace_control(self):
        marked = render.replace_generation_markers(
            "a {%- generation -%} b {%- endgeneration %} c", "<", ">")
        self.assertEqual(marked, "a {%- if true %}{{ '<' }}{% if true -%} b "
                                 "{%- endif %}{{ '>' }}{% endif %} c")
        plain = render.JinjaRenderer(marked, {}).render([])
        self.assertEqual(plain, "a<b> c")

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
