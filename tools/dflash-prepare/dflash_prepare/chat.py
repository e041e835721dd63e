"""Chat JSONL: one conversation per line, in either common form.

- OpenAI: {"messages": [{"role": "user", "content": "..."}, ...]}; an
  assistant message may carry "reasoning_content" and "tool_calls", a tool
  message "tool_call_id"/"name". Content may be a list of {"type": "text",
  "text": ...} parts.
- ShareGPT: {"conversations": [{"from": "human", "value": "..."}, ...]},
  optionally with a top-level "system" string.
A top-level "tools" list (tool definitions) is handed to the chat template.

Roles are normalised to system, user, assistant and tool. A line that cannot
be used is not an error of the whole run: it is dropped and counted under a
reason, with its file and line number (`Drops`).
"""
import collections
import json
import os
import re

from .errors import UserError, note

ROLES = {
    "system": "system",
    "developer": "system",
    "user": "user",
    "human": "user",
    "assistant": "assistant",
    "gpt": "assistant",
    "chatgpt": "assistant",
    "bot": "assistant",
    "model": "assistant",
    "tool": "tool",
    "function": "tool",
    "observation": "tool",
    "ipython": "tool",
}

# Why a conversation was dropped, in report order, with a description.
REASONS = {
    "malformed-json": "malformed json line",
    "malformed-conversation": "not a conversation",
    "unknown-role": "unknown role",
    "no-assistant-turn": "no assistant turn",
    "template-error": "chat template failed",
    "no-spans": "assistant spans not found in the render",
    "over-long": "over-long (--max-length)",
    "too-few-supervised": "fewer than 2 consecutive supervised tokens",
}

_THINK = re.compile(r"<think>.*?</think>\s*", re.DOTALL)


class Drops:
    """Dropped conversations counted per reason, with where and why. With
    `name_first`, the first that many of each reason are named on stderr as
    they are dropped (`FILE:LINE: why`), and `summarise` prints each
    reason's count."""

    def __init__(self, name_first=0):
        self.counts = collections.Counter()
        self.examples = collections.defaultdict(list)  # reason -> [text]
        self.name_first = name_first
        self.summarised = collections.Counter()  # reason -> count last printed

    def add(self, reason, where, why):
        assert reason in REASONS, reason
        self.counts[reason] += 1
        self.examples[reason].append(f"{where}: {why}")
        if self.counts[reason] <= self.name_first:
            note(f"dropped {where}: {why}")

    def summarise(self):
        """Prints the count of each reason that has grown since the last
        call, saying how many of them were named."""
        for reason, description in REASONS.items():
            count = self.counts[reason]
            if count == self.summarised[reason]:
                continue
            self.summarised[reason] = count
            named = min(count, self.name_first)
            note(f"{description}: {count} dropped"
                 + (f" (the first {named} named above)" if named < count else ""))

    def total(self):
        return sum(self.counts.values())

    def as_dict(self):
        return {reason: self.counts[reason] for reason in REASONS if self.counts[reason]}


class Conversation:
    """Normalised messages and where they came from (`file:line`)."""

    def __init__(self, messages, where, tools=None):
        self.messages = messages
        self.where = where
        self.tools = tools  # OpenAI-style tool definitions, for the template

    def __repr__(self):
        return f"Conversation({self.where}, {len(self.messages)} messages)"


class BadConversation(Exception):
    def __init__(self, reason, why):
        super().__init__(why)
        self.reason = reason
        self.why = why


def _content_text(content, index):
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, str):
                parts.append(part)
            elif isinstance(part, dict) and part.get("type") == "text" and \
                    isinstance(part.get("text"), str):
                parts.append(part["text"])
            else:
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise BadConversation("malformed-conversation",
                                      f"turn {index}: content part of type "
                                      f"'{kind}' is not text")
        return "".join(parts)
    raise BadConversation("malformed-conversation",
                          f"turn {index}: content is a {type(content).__name__}, "
                          "not a string")


def normalise(record, reasoning="keep"):
    """The messages of one JSON record, or BadConversation."""
    if not isinstance(record, dict):
        raise BadConversation("malformed-conversation",
                              f"the line is a json {type(record).__name__}, not an object")
    if "messages" in record:
        turns, role_key, text_key = record["messages"], "role", "content"
    elif "conversations" in record:
        turns, role_key, text_key = record["conversations"], "from", "value"
    else:
        raise BadConversation("malformed-conversation",
                              "the object has neither 'messages' nor 'conversations'")
    if not isinstance(turns, list):
        raise BadConversation("malformed-conversation",
                              f"'{'messages' if role_key == 'role' else 'conversations'}' "
                              "is not a list")
    messages = []
    system = record.get("system")
    if role_key == "from" and isinstance(system, str) and system:
        messages.append({"role": "system", "content": system})
    for index, turn in enumerate(turns):
        if not isinstance(turn, dict):
            raise BadConversation("malformed-conversation",
                                  f"turn {index} is not an object")
        raw_role = turn.get(role_key, turn.get("role"))
        if not isinstance(raw_role, str):
            raise BadConversation("malformed-conversation",
                                  f"turn {index} has no '{role_key}' string")
        role = ROLES.get(raw_role.strip().lower())
        if role is None:
            raise BadConversation("unknown-role",
                                  f"turn {index} has unknown role '{raw_role}'")
        raw = turn.get(text_key, turn.get("content"))
        content = _content_text(raw, index)
        message = {"role": role, "content": content}
        if role == "assistant" and raw is None and turn.get("tool_calls"):
            # An OpenAI tool-call turn: the null goes to the template as it
            # is (DeepSeek's tells tool-call turns by it), "" where it fails.
            message["content"] = None
        if role == "assistant":
            thought = turn.get("reasoning_content", turn.get("reasoning"))
            if thought is not None and not isinstance(thought, str):
                raise BadConversation("malformed-conversation",
                                      f"turn {index}: reasoning_content is not a string")
            if reasoning == "drop":
                if message["content"] and "<think>" in content:
                    message["content"] = _THINK.sub("", content).lstrip()
            elif thought:
                message["reasoning_content"] = thought
            calls = turn.get("tool_calls")
            if calls:
                if not isinstance(calls, list):
                    raise BadConversation("malformed-conversation",
                                          f"turn {index}: tool_calls is not a list")
                message["tool_calls"] = calls
        if role == "tool":
            for key in ("tool_call_id", "name"):
                if isinstance(turn.get(key), str):
                    message[key] = turn[key]
        messages.append(message)
    if not any(m["role"] == "assistant" for m in messages):
        raise BadConversation("no-assistant-turn",
                              f"{len(messages)} turns, none of them the assistant's")
    return messages


def check_inputs(paths, out=None):
    """Refuses an input named twice (every conversation would be read, and
    written, twice) and an `out` that is one of the inputs (writing it, or
    --overwrite, would destroy the data being read)."""
    seen = {}
    for path in paths:
        real = os.path.realpath(path)
        if real in seen:
            raise UserError(f"{path}: named twice as an input (also as {seen[real]})")
        seen[real] = path
    if out is not None and os.path.realpath(out) in seen:
        raise UserError(f"{out}: the output is also an input "
                        f"({seen[os.path.realpath(out)]}); give --out another file")


def _lone_surrogate(record):
    """Whether a json value holds a string with an unpaired surrogate (JSON
    may escape one): no tokenizer or UTF-8 output can take it."""
    stack = [record]
    while stack:  # not recursive: a record nests as deep as json.loads took
        value = stack.pop()
        if isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                return True
        elif isinstance(value, dict):
            stack.extend(value)
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)
    return False


def read_conversations(paths, drops, reasoning="keep"):
    """Yields Conversations from JSONL files (UTF-8, a byte-order mark at
    the start allowed); every unusable line goes into `drops`. Blank lines
    are skipped silently."""
    for path in paths:
        try:
            f = open(path, "rb")
        except OSError as error:
            raise UserError(f"{path}: cannot open: {error.strerror}") from None
        with f:
            try:
                yield from _lines(path, f, drops, reasoning)
            except OSError as error:  # a read error part way (EIO, a vanished mount)
                raise UserError(f"{path}: cannot read: {error.strerror or error}") from None


def _lines(path, f, drops, reasoning):
    """The Conversations of one open file (read_conversations)."""
    for number, raw in enumerate(f, 1):
        where = f"{path}:{number}"
        if number == 1 and raw.startswith(b"\xef\xbb\xbf"):
            raw = raw[3:]  # a UTF-8 byte-order mark, as some editors write
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as error:
            drops.add("malformed-json", where,
                      f"not utf-8 text (byte {error.start + 1} of the line)")
            continue
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            drops.add("malformed-json", where,
                      f"malformed json: {error.msg[:1].lower() + error.msg[1:]} "
                      f"at column {error.colno}")
            continue
        except RecursionError:
            drops.add("malformed-json", where,
                      "nests deeper than python's json reader follows")
            continue
        except ValueError as error:  # an integer of more than 4300 digits
            why = str(error).split(":")[0]
            drops.add("malformed-json", where, f"malformed json: {why[:1].lower() + why[1:]}")
            continue
        if "\\u" in line and _lone_surrogate(record):
            drops.add("malformed-json", where,
                      "a string escapes a lone surrogate (\\ud800-\\udfff alone "
                      "is not a unicode character)")
            continue
        try:
            messages = normalise(record, reasoning)
        except BadConversation as bad:
            drops.add(bad.reason, where, bad.why)
            continue
        tools = record.get("tools")
        yield Conversation(messages, where,
                           tools if isinstance(tools, list) and tools else None)
