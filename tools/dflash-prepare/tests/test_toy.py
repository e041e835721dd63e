import json
import unittest

from helpers import TempDir

from dflash_prepare import chat, toy


class ToyCorpusTest(TempDir):
    def test_deterministic(self):
        self.assertEqual(toy.make_corpus(50, seed=3), toy.make_corpus(50, seed=3))
        self.assertNotEqual(toy.make_corpus(50, seed=3), toy.make_corpus(50, seed=4))

    def test_every_record_reads_without_drops(self):
        records = toy.make_corpus(300, seed=0)
        path = self.path("chat.jsonl")
        toy.write_jsonl(path, records)
        drops = chat.Drops()
        conversations = list(chat.read_conversations([path], drops))
        self.assertEqual(drops.total(), 0)
        self.assertEqual(len(conversations), 300)
        forms = {("messages" in r) for r in records}
        self.assertEqual(forms, {True, False})  # both OpenAI and ShareGPT lines
        roles = {m["role"] for c in conversations for m in c.messages}
        self.assertEqual(roles, {"system", "user", "assistant", "tool"})
        self.assertTrue(any("reasoning_content" in m for c in conversations for m in c.messages))
        self.assertTrue(any("tool_calls" in m for c in conversations for m in c.messages))

    def test_answers_follow_from_the_requests(self):
        # What makes it learnable: the answer is a function of the request.
        for record in toy.make_corpus(200, seed=1):
            turns = record.get("messages") or [
                {"role": {"human": "user", "gpt": "assistant"}.get(t["from"], t["from"]),
                 "content": t["value"]} for t in record["conversations"]]
            request = None
            for turn in turns:
                if turn["role"] == "user":
                    request = turn["content"]
                elif turn["role"] == "assistant" and not turn.get("tool_calls"):
                    kind, _, rest = request.partition(": ")
                    words = rest.split()
                    expected = {
                        "repeat": " ".join(words), "reverse": " ".join(reversed(words)),
                        "sort": " ".join(sorted(words)), "upper": " ".join(words).upper(),
                        "spell": " ".join(rest), "pairs": " ".join(f"{w}-{w}" for w in words),
                    }.get(kind)
                    if request.startswith("count from"):
                        a, b = int(request.split()[2]), int(request.split()[4])
                        expected = " ".join(str(i) for i in range(a, b + 1))
                    self.assertEqual(turn["content"], expected, request)

    def test_templates(self):
        from dflash_prepare.template import has_generation_markers
        self.assertTrue(has_generation_markers(toy.QWEN_STYLE_TEMPLATE))
        self.assertFalse(has_generation_markers(toy.QWEN_STYLE_TEMPLATE_PLAIN))
        self.assertIn("loop.last", toy.QWEN_STYLE_TEMPLATE_LAST_REASONING)
        texts = toy.corpus_texts(toy.make_corpus(5))
        self.assertTrue(all(isinstance(t, str) and t for t in texts))
        json.dumps(texts)


if __name__ == "__main__":
    unittest.main()
