"""Assistant spans of one conversation, from its one full render
(docs/semantics.md section 11).

A span is a character range of the render that the target generates in one
assistant turn. Three methods, tried in this order for each conversation:

- `generation-markers`: a template with `{% generation %}...{%
  endgeneration %}` says itself what is generated. Each marker prints a
  sentinel character for one render; the text without them must equal the
  plain render.
- `sentinels`: every assistant message's reasoning, content and tool-call
  text (name, string arguments) is wrapped in its own pair of private-use
  characters (inside its leading and trailing whitespace, so that a template
  that strips or trims the text strips the same), and the conversation is
  rendered once. The text without them must equal the plain render, and the
  pairs must come back whole, each at most once and in turn order; a template
  may drop a piece (Qwen3 drops earlier turns' reasoning). A turn's span then
  runs
    from: the end of the generation prompt just before its first piece (the
          prompt a serving engine writes; the longest of the template's
          prompts, Qwen3's `enable_thinking=False` one with its empty think
          block included, or the shortest with `supervise_prefill`), or from
          its first piece where no prompt text is found there;
    to:   the first end-of-turn token after its last piece (`<|im_end|>`,
          `<|eot_id|>`, ...), not the newline the template writes after it,
          or its last piece where that turn has none before the next.
  Template text inside that range (`<think>\\n`, `<tool_call>` framing) is
  generated too. An empty answer is a zero-width piece (its end-of-turn token
  is supervised), where the template renders it unchanged.
- `prefixes`: where the sentinels do not survive, turn i spans from the end of
  the render of messages[:i] with the generation prompt to the end of the
  render of messages[:i+1], cut after its last end-of-turn token. This needs
  each of those renders to be a prefix of the next and of the whole.

A conversation that none of them can read raises `NoSpans` (it is dropped
and counted, never the end of a run).
"""
import re

from .render import TemplateFailure, has_generation_markers, replace_generation_markers

# Sentinels: piece k opens with PIECE_BASE + 2k and closes with the next
# code point, in the supplementary private-use plane 15 (no tokenizer or
# template gives these a meaning).
PIECE_BASE = 0xF0000
MAX_PIECES = (0xFFFFE - PIECE_BASE) // 2
_PIECE_CHARS = re.compile("[\U000F0000-\U000FFFFF]")
_MARKER_OPEN, _MARKER_CLOSE = chr(PIECE_BASE), chr(PIECE_BASE + 1)

# Template options whose generation prompts a serving engine may write
# (Qwen3 and Qwen3.5/3.6: enable_thinking; DeepSeek-V3.1: thinking).
THINKING_OPTIONS = ("enable_thinking", "thinking")

# End-of-turn tokens of the common templates, used where the tokenizer has
# them as special tokens (beside its eos token and generation_config.json's).
KNOWN_END_OF_TURN = ("<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<|end|>", "<|return|>",
                     "<|call|>", "<\uff5cend\u2581of\u2581sentence\uff5c>", "<end_of_turn>",
                     "<|endoftext|>", "</s>")


class NoSpans(Exception):
    """No method found this conversation's assistant spans; why each failed."""


class _Mismatch(Exception):
    """One method cannot read this conversation."""


class SpanSettings:
    def __init__(self, end_of_turn=(), last_turn_only=False, supervise_prefill=False):
        self.end_of_turn = tuple(t for t in end_of_turn if t)
        self.last_turn_only = last_turn_only
        self.supervise_prefill = supervise_prefill


class Spans:
    """The render, its assistant spans and what was found on the way."""

    def __init__(self, text, spans, method, turns, without_end=0):
        self.text = text
        self.spans = spans              # [(start, end)] characters, in order
        self.method = method            # generation-markers, sentinels, prefixes
        self.turns = turns              # assistant turns in the conversation
        self.supervised = sum(1 for s, e in spans if e > s)
        self.without_end = without_end  # spans with no end-of-turn token


def find_spans(renderer, messages, tools, settings):
    """Spans of `messages` rendered with `renderer`. Raises TemplateFailure
    where the template cannot render them, NoSpans where no method reads
    them."""
    text = renderer.render(messages, tools, False)
    methods = [("generation-markers", _marker_spans)] \
        if has_generation_markers(renderer.template) else []
    methods += [("sentinels", _sentinel_spans), ("prefixes", _prefix_spans)]
    failures = []
    for name, method in methods:
        try:
            return method(renderer, messages, tools, text, settings)
        except _Mismatch as mismatch:
            failures.append(f"{name}: {mismatch}")
    raise NoSpans("; ".join(failures))


def _assistant_turns(messages):
    return [i for i, m in enumerate(messages) if m.get("role") == "assistant"]


def _first_difference(a, b):
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def _difference(a, b):
    at = _first_difference(a, b)
    return f"at character {at}: {a[max(0, at - 20):at + 20]!r} vs {b[max(0, at - 20):at + 20]!r}"


def _strip_pieces(marked, count):
    """The text without sentinels, and each piece's (start, end) in it.
    Raises _Mismatch unless every piece that is there is one whole pair."""
    found, open_piece, removed = {}, None, 0
    for match in _PIECE_CHARS.finditer(marked):
        k, closing = divmod(ord(match.group()) - PIECE_BASE, 2)
        at = match.start() - removed
        removed += 1
        if k >= count:
            raise _Mismatch(f"the template wrote sentinel {k}, of no piece")
        if not closing:
            if open_piece is not None:
                raise _Mismatch(f"piece {k} opens inside piece {open_piece}")
            if k in found:
                raise _Mismatch(f"piece {k} is rendered twice")
            found[k], open_piece = (at, None), k
        else:
            if open_piece != k:
                raise _Mismatch(f"piece {k} closes without opening (the template "
                                "cut its text apart)")
            found[k], open_piece = (found[k][0], at), None
    if open_piece is not None:
        raise _Mismatch(f"piece {open_piece} opens and never closes (the template "
                        "cut its text apart)")
    return _PIECE_CHARS.sub("", marked), found


def _marker_spans(renderer, messages, tools, text, settings):
    if _PIECE_CHARS.search(text):
        raise _Mismatch("the conversation holds private-use characters of plane 15 "
                        "(U+F0000-U+FFFFF), the sentinels")
    template = replace_generation_markers(renderer.template, _MARKER_OPEN, _MARKER_CLOSE)
    marked = _render_marked(renderer, messages, tools, template)
    markers = re.compile(f"[{_MARKER_OPEN}{_MARKER_CLOSE}]")
    plain = markers.sub("", marked)
    if plain != text:
        raise _Mismatch("the template renders differently once its generation "
                        f"markers are located ({_difference(plain, text)})")
    spans, start, removed = [], None, 0
    for match in markers.finditer(marked):
        at = match.start() - removed
        removed += 1
        if match.group() == _MARKER_OPEN:
            start = at
        elif start is not None:
            spans.append((start, at))
            start = None
    if settings.last_turn_only:
        spans = spans[-1:]
    return Spans(text, spans, "generation-markers", len(_assistant_turns(messages)))


def _render_marked(renderer, messages, tools, template=None):
    try:
        return renderer.render(messages, tools, False, template=template)
    except TemplateFailure as failure:
        raise _Mismatch(f"the template fails once the text is marked: {failure}") from None


class _Pieces:
    """Wraps the generated text of assistant messages in sentinel pairs, and
    the content of the others in fences (pairs that bound the turns)."""

    def __init__(self):
        self.turn_of = []   # piece k -> index of its message
        self.fence = []     # piece k -> whether it is another message's content

    def wrap(self, text, turn, empty=False, fence=False):
        core = text.strip()
        if not core and not empty:
            return text
        k = len(self.turn_of)
        self.turn_of.append(turn)
        self.fence.append(fence)
        lead = len(text) - len(text.lstrip()) if core else len(text)
        tail = lead + len(core)
        return (text[:lead] + chr(PIECE_BASE + 2 * k) + core +
                chr(PIECE_BASE + 2 * k + 1) + text[tail:])

    def content(self, text, turn, empty):
        """Content with an inline `<think>...</think>` as two pieces, the
        reasoning and the answer, as templates that split it out render
        them."""
        end = text.find("</think>")
        if end < 0:
            return self.wrap(text, turn, empty)
        begin = text.rfind("<think>", 0, end)
        head, opening = (text[:begin], "<think>") if begin >= 0 else ("", "")
        thought = text[begin + len("<think>"):end] if begin >= 0 else text[:end]
        return (self.wrap(head, turn) + opening + self.wrap(thought, turn) + "</think>" +
                self.wrap(text[end + len("</think>"):], turn))

    def tool_call(self, call, turn):
        if not isinstance(call, dict):
            return call
        call = dict(call)
        holder = call
        if isinstance(call.get("function"), dict):
            holder = call["function"] = dict(call["function"])
        for key in ("name", "arguments"):
            if isinstance(holder.get(key), str):
                holder[key] = self.wrap(holder[key], turn)
        return call

    def message(self, message, turn, empty):
        """The message with its pieces marked; `empty`: an empty answer is a
        zero-width piece."""
        marked = dict(message)
        if isinstance(message.get("reasoning_content"), str):
            marked["reasoning_content"] = self.wrap(message["reasoning_content"], turn)
        if isinstance(message.get("content"), str):
            marked["content"] = self.content(message["content"], turn, empty)
        if isinstance(message.get("tool_calls"), list):
            marked["tool_calls"] = [self.tool_call(c, turn) for c in message["tool_calls"]]
        return marked

    def fenced(self, message, index):
        """A system, user or tool message with its content fenced."""
        if not isinstance(message.get("content"), str):
            return message
        return dict(message, content=self.wrap(message["content"], index, fence=True))


def _variants(template):
    """Template options to render generation prompts with: the defaults, and
    each thinking option the template reads set either way."""
    return [{}] + [{name: value} for name in THINKING_OPTIONS if name in template
                   for value in (False, True)]


def _headers(renderer, messages, tools, text):
    """The generation prompts the template writes after this conversation,
    with its default options and each thinking option set either way."""
    headers = []
    for options in _variants(renderer.template):
        try:
            prompted = renderer.render(messages, tools, True, **options)
        except TemplateFailure:
            continue
        # An option that changes the history gives no header to look for.
        if prompted.startswith(text) and len(prompted) > len(text):
            header = prompted[len(text):]
            if header not in headers:
                headers.append(header)
    return headers


def _turn_start(text, lower, first, headers, prompts, settings):
    """Where turn text starts: after the generation prompt that ends last
    before `first` (with supervise_prefill: the shortest one found). The
    prompts are looked for as text before the turn (`headers`, from the whole
    conversation's render), else as renders of the messages before the turn
    (`prompts()`) that the whole render starts with; else at `first`."""
    found = []
    for header in headers:
        at = text.rfind(header, lower, first)
        if at >= 0:
            found.append((len(header), at + len(header)))
    if not found:
        found = [(end, end) for end in prompts() if lower <= end <= first]
    if not found:
        return first
    if settings.supervise_prefill:
        return min(found)[1]
    return max(end for _, end in found)


def _prompt_ends(renderer, messages, tools, turn, text):
    """The lengths of the renders of messages[:turn] with a generation prompt
    (each thinking option either way) that are prefixes of `text`."""
    ends = []
    for options in _variants(renderer.template):
        try:
            prompted = renderer.render(messages[:turn], tools, True, **options)
        except TemplateFailure:
            continue
        if text.startswith(prompted):
            ends.append(len(prompted))
    return ends


def _turn_end(text, last, bound, following, settings):
    """The end of the first end-of-turn token after `last` and before
    `bound`, or None. A token past the next message's text is not this
    turn's."""
    best = None
    for token in settings.end_of_turn:
        at = text.find(token, last, bound)
        if at >= 0 and (best is None or at < best[0]):
            best = (at, at + len(token))
    if best is None:
        return None
    if following and following in text[last:best[0]]:
        return None
    return best[1]


def _following_text(messages, turn, settings):
    """The start of the next message's content, unless it is the assistant's:
    stripped, up to an end-of-turn token in it, at most 32 characters."""
    if turn + 1 < len(messages) and messages[turn + 1].get("role") != "assistant":
        content = messages[turn + 1].get("content")
        if isinstance(content, str):
            head = content.strip()[:32]
            for token in settings.end_of_turn:
                head = head.split(token)[0]
            return head
    return ""


def _sentinel_spans(renderer, messages, tools, text, settings):
    if _PIECE_CHARS.search(text):
        raise _Mismatch("the conversation holds private-use characters of plane 15 "
                        "(U+F0000-U+FFFFF), the sentinels")
    turns = _assistant_turns(messages)
    empty = [i for i in turns if isinstance(messages[i].get("content"), str)
             and not messages[i]["content"].strip()]
    # Empty answers as zero-width pieces where the template renders a marked
    # one as it renders an empty one: first all, then those without tool
    # calls (Qwen3 writes a newline before a tool call after content), then
    # none.
    choices = [set(empty), {i for i in empty if not messages[i].get("tool_calls")}, set()]
    choices = [c for n, c in enumerate(choices) if c not in choices[:n]]
    failure = None
    # The other messages' content fenced first, so that a turn's end-of-turn
    # token is looked for only before the next message's text; unfenced where
    # that changes the render (Qwen3 reads a user's <tool_response>).
    for fenced in (True, False):
        for zero_width in choices:
            pieces = _Pieces()
            marked_messages = [
                pieces.message(m, i, i in zero_width) if i in turns else
                pieces.fenced(m, i) if fenced else m for i, m in enumerate(messages)]
            if len(pieces.turn_of) > MAX_PIECES:
                raise _Mismatch(f"{len(pieces.turn_of)} pieces, more than the "
                                f"{MAX_PIECES} sentinel pairs")
            marked = _render_marked(renderer, marked_messages, tools)
            try:
                plain, found = _strip_pieces(marked, len(pieces.turn_of))
            except _Mismatch as mismatch:
                failure = mismatch
                continue
            if plain != text:
                failure = _Mismatch("the template renders differently with the "
                                    f"sentinels ({_difference(plain, text)})")
                continue
            return _spans_of_pieces(renderer, messages, tools, text, pieces, found,
                                    settings)
    raise failure


def _spans_of_pieces(renderer, messages, tools, text, pieces, found, settings):
    bounds, fences = {}, []
    for k, (start, end) in found.items():
        if pieces.fence[k]:
            fences.append((start, end))
            continue
        turn = pieces.turn_of[k]
        first, last = bounds.get(turn, (start, end))
        bounds[turn] = (min(first, start), max(last, end))
    fences.sort()
    order = sorted(bounds)
    for a, b in zip(order, order[1:]):
        if bounds[a][1] > bounds[b][0]:
            raise _Mismatch(f"turn {a}'s text and turn {b}'s interleave in the render")
    for turn in order:
        first, last = bounds[turn]
        if any(first < e and s < last for s, e in fences):
            raise _Mismatch(f"another message's text lies inside turn {turn}'s")
    headers = _headers(renderer, messages, tools, text)
    last_turn = _assistant_turns(messages)[-1]
    spans, lower, without_end = [], 0, 0
    for n, turn in enumerate(order):
        first, last = bounds[turn]
        # Between the text of the messages around it, and the turns around it.
        lower = max([lower] + [e for s, e in fences if e <= first])
        bound = min([bounds[order[n + 1]][0] if n + 1 < len(order) else len(text)] +
                    [s for s, e in fences if s >= last])
        start = _turn_start(text, lower, first, headers,
                            lambda turn=turn: _prompt_ends(renderer, messages, tools, turn, text),
                            settings)
        end = _turn_end(text, last, bound, _following_text(messages, turn, settings), settings)
        lower = last if end is None else end
        if settings.last_turn_only and turn != last_turn:
            continue
        if end is None:
            without_end += 1
        spans.append((start, last if end is None else end))
    return Spans(text, spans, "sentinels", len(_assistant_turns(messages)), without_end)


def _prefix_spans(renderer, messages, tools, text, settings):
    turns = _assistant_turns(messages)
    if settings.last_turn_only:
        turns = turns[-1:]
    spans, without_end = [], 0
    for i in turns:
        try:
            through = renderer.render(messages[:i + 1], tools, False)
            before = renderer.render(messages[:i], tools, True)
        except TemplateFailure as failure:
            raise _Mismatch(f"turn {i}: the template fails on the conversation up "
                            f"to it: {failure}") from None
        if not text.startswith(through):
            raise _Mismatch(f"turn {i}: the render through it is not a prefix of the "
                            f"whole conversation's ({_difference(through, text)})")
        # The generation prompts before the turn that the render holds.
        starts = _prompt_ends(renderer, messages, tools, i, through)
        if not starts:
            raise _Mismatch(f"turn {i}: the render up to its generation prompt is not "
                            f"a prefix of the render with the turn "
                            f"({_difference(before, through)})")
        start = min(starts) if settings.supervise_prefill else max(starts)
        end = len(through)
        tail = through[start:end]
        # Cut after the last end-of-turn token that only whitespace follows.
        cuts = [tail.rfind(t) + len(t) for t in settings.end_of_turn
                if tail.rfind(t) >= 0 and not tail[tail.rfind(t) + len(t):].strip()]
        if cuts:
            end = start + max(cuts)
        else:
            without_end += 1
        spans.append((start, end))
    return Spans(text, spans, "prefixes", len(_assistant_turns(messages)), without_end)
