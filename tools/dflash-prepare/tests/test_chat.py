import json
import unittest

from helpers import TempDir

from dflash_prepare import chat


def lines(*records):
    return "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records)


class ChatReaderTest(TempDir):
    def read(self, text, reasoning="keep"):
        path = self.write_file("data.jsonl", text)
        drops = chat.Drops()
        conversations = list(chat.read_conversations([path], drops, reasoning))
        return path, conversations, drops

    def test_a_byte_order_mark_at_the_start_is_read_over(self):
        record = {"messages": [{"role": "user", "content": "q"},
                               {"role": "assistant", "content": "a"}]}
        path, convs, drops = self.read("\ufeff" + lines(record, record))
        self.assertEqual((len(convs), drops.total()), (2, 0))
        self.assertEqual(convs[0].where, f"{path}:1")
        # Elsewhere it is a bad line, as any stray character.
        path, convs, drops = self.read(lines(record) + "\ufeff" + lines(record))
        self.assertEqual((len(convs), drops.as_dict()), (1, {"malformed-json": 1}))

    def test_both_forms_and_roles(self):
        path, convs, drops = self.read(lines(
            {"messages": [{"role": "system", "content": "s"},
                          {"role": "user", "content": [{"type": "text", "text": "a"},
                                                       {"type": "text", "text": "b"}]},
                          {"role": "assistant", "content": "c", "reasoning_content": "r"},
                          {"role": "tool", "content": "t", "tool_call_id": "x"}]},
            {"system": "be brief",
             "conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "a"},
                               {"from": "observation", "value": "o"}]}))
        self.assertEqual(drops.total(), 0)
        self.assertEqual(convs[0].messages, [
            {"role": "system", "content": "s"}, {"role": "user", "content": "ab"},
            {"role": "assistant", "content": "c", "reasoning_content": "r"},
            {"role": "tool", "content": "t", "tool_call_id": "x"}])
        self.assertEqual([m["role"] for m in convs[1].messages],
                         ["system", "user", "assistant", "tool"])
        self.assertEqual(convs[1].messages[0]["content"], "be brief")
        self.assertEqual(convs[0].where, f"{path}:1")
        self.assertEqual(convs[1].where, f"{path}:2")

    def test_reasoning_drop(self):
        _, convs, _ = self.read(lines(
            {"messages": [{"role": "user", "content": "q"},
                          {"role": "assistant", "content": "<think>\nhm\n</think>\n\nanswer",
                           "reasoning_content": "r"}]}), reasoning="drop")
        self.assertEqual(convs[0].messages[1], {"role": "assistant", "content": "answer"})

    def test_every_bad_line_is_counted_with_its_number(self):
        path, convs, drops = self.read(lines(
            {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]},
            "{not json",
            "",
            {"messages": [{"role": "user", "content": "only a question"}]},
            {"messages": [{"role": "user", "content": "q"}, {"role": "robot", "content": "a"}]},
            {"text": "no turns"},
            [1, 2],
            {"messages": [{"role": "user", "content": 3}, {"role": "assistant", "content": "a"}]},
            {"messages": [{"role": "user", "content": [{"type": "image_url"}]},
                          {"role": "assistant", "content": "a"}]},
        ))
        self.assertEqual(len(convs), 1)
        self.assertEqual(drops.as_dict(), {"malformed-json": 1, "malformed-conversation": 4,
                                           "unknown-role": 1, "no-assistant-turn": 1})
        self.assertEqual(drops.examples["malformed-json"],
                         [f"{path}:2: malformed json: expecting property name enclosed "
                          "in double quotes at column 2"])
        self.assertEqual(drops.examples["no-assistant-turn"],
                         [f"{path}:4: 1 turns, none of them the assistant's"])
        self.assertEqual(drops.examples["unknown-role"],
                         [f"{path}:5: turn 1 has unknown role 'robot'"])
        self.assertEqual(drops.examples["malformed-conversation"], [
            f"{path}:6: the object has neither 'messages' nor 'conversations'",
            f"{path}:7: the line is a json list, not an object",
            f"{path}:8: turn 0: content is a int, not a string",
            f"{path}:9: turn 0: content part of type 'image_url' is not text"])

    def test_bytes_that_are_not_utf8(self):
        path = self.path("data.jsonl")
        good = json.dumps({"messages": [{"role": "user", "content": "q"},
                                        {"role": "assistant", "content": "a"}]})
        with open(path, "wb") as f:
            f.write(b'{"messages": "\xff"}\n' + good.encode() + b"\n")
        drops = chat.Drops()
        self.assertEqual(len(list(chat.read_conversations([path], drops))), 1)
        self.assertEqual(drops.examples["malformed-json"],
                         [f"{path}:1: not utf-8 text (byte 15 of the line)"])

    def test_missing_file(self):
        drops = chat.Drops()
        with self.assertRaises(chat.UserError) as caught:
            list(chat.read_conversations([self.path("none.jsonl")], drops))
        self.assertIn("none.jsonl: cannot open", str(caught.exception))

    def test_inputs_named_twice_or_written_over_are_refused(self):
        # tokens and regenerate call this before reading anything.
        path = self.write_file("a.jsonl", "{}\n")
        alias = self.path("sub/../a.jsonl")
        self.write_file("sub/keep", "")
        for paths, out, why in (([path, alias], None, "named twice as an input"),
                                ([path], path, "the output is also an input")):
            with self.assertRaises(chat.UserError) as caught:
                chat.check_inputs(paths, out)
            self.assertIn(why, str(caught.exception))
        chat.check_inputs([path], self.path("out.jsonl"))  # distinct: accepted


if __name__ == "__main__":
    unittest.main()
