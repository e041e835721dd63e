"""Token ids and loss masks from the tokenizer's own chat template.

A conversation is rendered to text once with the template and tokenized once
(with character offsets); the assistant parts are character spans of that
text, and a token is supervised iff its characters overlap a span. The spans
come from one of two places:

- `generation` markers: a template with `{% generation %}...{% endgeneration
  %}` says itself what the assistant generates. The template is rendered with
  each marker replaced by a sentinel character, the sentinels give the spans,
  and the text without them must equal the plain render.
- prefixes: otherwise assistant turn i spans from the end of the render of
  messages[:i] with the generation prompt to the end of the render of
  messages[:i+1], cut after the last end-of-sequence token in it when only
  whitespace follows (the newline after `<|im_end|>` is the template's, not
  the model's). This needs the prefix property (each of those renders is a
  prefix of the next and of the whole); a template without it is refused.
"""
import hashlib
import os
import re

import numpy as np

from .errors import UserError, require, warn

_OPEN = "\ue000"
_CLOSE = "\ue001"
_GENERATION = re.compile(r"\{%(-?)\s*(generation|endgeneration)\s*(-?)%\}")


def has_generation_markers(template):
    return bool(_GENERATION.search(template or ""))


def _sentinel_template(template):
    """The template with each generation tag replaced by an `if true` block
    that prints a sentinel, keeping the tags' whitespace control."""
    def replace(match):
        left, kind, right = match.groups()
        if kind == "generation":
            return (f"{{%{left} if true %}}{{{{ '{_OPEN}' }}}}"
                    f"{{% if true {right}%}}")
        return (f"{{%{left} endif %}}{{{{ '{_CLOSE}' }}}}"
                f"{{% endif {right}%}}")
    return _GENERATION.sub(replace, template)


def template_sha256(template):
    return hashlib.sha256(template.encode("utf-8")).hexdigest()


def load_tokenizer(directory):
    """A Hugging Face tokenizer from a local directory (never the hub)."""
    if not os.path.isdir(directory):
        raise UserError(f"{directory}: tokenizer directory does not exist")
    transformers = require("transformers", "reading the tokenizer")
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(
            directory, local_files_only=True)
    except Exception as error:  # transformers raises many kinds here
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise UserError(f"{directory}: cannot load a tokenizer "
                        f"(tokenizer.json / tokenizer_config.json): {first}") from None
    if not getattr(tokenizer, "is_fast", False):
        raise UserError(f"{directory}: the tokenizer is not a fast tokenizer "
                        "(no tokenizer.json); loss masks need its character offsets")
    return tokenizer


def chat_template_of(tokenizer, directory):
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):
        template = template.get("default")
    if not isinstance(template, str) or not template.strip():
        raise UserError(f"{directory}: the tokenizer has no chat template "
                        "('chat_template' in tokenizer_config.json or "
                        "chat_template.jinja)")
    return template


class TemplateFailure(Exception):
    """The template could not render one conversation (it is dropped)."""


class PrefixPropertyError(UserError):
    """The template does not render conversations incrementally."""


def _first_difference(a, b):
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


class Encoded:
    def __init__(self, ids, mask):
        self.ids = ids    # np.int32 [n]
        self.mask = mask  # np.uint8 [n]


class ChatEncoder:
    """Encodes normalised conversations with one tokenizer's template."""

    def __init__(self, tokenizer, template, tokenizer_dir, last_turn_only=False):
        self.tokenizer = tokenizer
        self.template = template
        self.tokenizer_dir = tokenizer_dir
        self.last_turn_only = last_turn_only
        self.method = "generation-markers" if has_generation_markers(template) else "prefixes"
        self.sentinel_template = _sentinel_template(template) \
            if self.method == "generation-markers" else None
        eos = getattr(tokenizer, "eos_token", None)
        self.stop_text = eos if isinstance(eos, str) and eos else None

    def render(self, messages, generation_prompt, tools=None, template=None):
        try:
            text = self.tokenizer.apply_chat_template(
                messages, tools=tools, tokenize=False,
                add_generation_prompt=generation_prompt,
                chat_template=template or self.template)
        except Exception as error:  # jinja2 errors, the template's own raise_exception
            raise TemplateFailure(str(error).strip().splitlines()[0]
                                  if str(error).strip() else type(error).__name__) from None
        if not isinstance(text, str):
            raise TemplateFailure(f"the template rendered a {type(text).__name__}")
        return text

    def _marker_spans(self, conversation, text):
        marked = self.render(conversation.messages, False, conversation.tools,
                             self.sentinel_template)
        if marked.replace(_OPEN, "").replace(_CLOSE, "") != text:
            raise UserError(f"{self.tokenizer_dir}: the chat template renders "
                            "differently once its generation markers are located "
                            f"(first seen on {conversation.where}); cannot build "
                            "loss masks from them")
        spans, start, removed = [], None, 0
        for index, char in enumerate(marked):
            if char == _OPEN:
                start = index - removed
                removed += 1
            elif char == _CLOSE:
                if start is not None:
                    spans.append((start, index - removed))
                start = None
                removed += 1
        if self.last_turn_only:
            spans = spans[-1:]
        return spans

    def _refuse(self, conversation, turn, what, a, b):
        at = _first_difference(a, b)
        context = lambda s: repr(s[max(0, at - 30):at + 30])
        raise PrefixPropertyError(
            f"{self.tokenizer_dir}: the chat template does not render "
            f"conversations incrementally ({conversation.where}, turn {turn}: {what}; "
            f"they differ at character {at}: {context(a)} vs {context(b)}). Loss "
            "masks from prefixes need that; use a template with {% generation %} "
            "markers, or --last-turn-only (only the last turn's prefix is "
            "needed), or --reasoning drop where the template drops earlier "
            "turns' reasoning")

    def _prefix_spans(self, conversation, text):
        messages = conversation.messages
        turns = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
        if self.last_turn_only:
            turns = turns[-1:]
        spans = []
        for i in turns:
            before = self.render(messages[:i], True, conversation.tools)
            through = self.render(messages[:i + 1], False, conversation.tools)
            if not through.startswith(before):
                self._refuse(conversation, i, "the render up to the assistant "
                             "prompt is not a prefix of the render with the turn",
                             before, through)
            if not text.startswith(through):
                self._refuse(conversation, i, "the render through this turn is "
                             "not a prefix of the whole conversation's", through, text)
            start, end = len(before), len(through)
            if self.stop_text:
                tail = through[start:end]
                cut = tail.rfind(self.stop_text)
                if cut >= 0 and not tail[cut + len(self.stop_text):].strip():
                    end = start + cut + len(self.stop_text)
            spans.append((start, end))
        return spans

    def encode(self, conversation):
        text = self.render(conversation.messages, False, conversation.tools)
        if self.method == "generation-markers":
            spans = self._marker_spans(conversation, text)
        else:
            spans = self._prefix_spans(conversation, text)
        encoding = self.tokenizer(text, add_special_tokens=False,
                                  return_offsets_mapping=True)
        ids = np.asarray(encoding["input_ids"], dtype=np.int64)
        offsets = np.asarray(encoding["offset_mapping"], dtype=np.int64).reshape(-1, 2)
        return Encoded(ids.astype(np.int32), spans_to_mask(offsets, spans))


def spans_to_mask(offsets, spans):
    """1 on tokens whose characters [start, end) overlap a span."""
    starts, ends = offsets[:, 0], offsets[:, 1]
    mask = np.zeros(len(offsets), dtype=bool)
    for begin, end in spans:
        if end <= begin:
            continue
        overlap = (starts < end) & (ends > begin)
        empty = (ends == starts) & (starts >= begin) & (starts < end)
        mask |= overlap | empty
    return mask.astype(np.uint8)


def check_mask_token(tokenizer, spec, tokenizer_dir):
    """What the spec's mask_token_id is to the tokenizer: a list of lines
    for the report; raises UserError where it cannot work."""
    mask_id = spec.mask_token_id
    size = len(tokenizer)
    where = f"{spec.path}: [drafter] mask_token_id {mask_id}"
    if size > spec.vocab_size:
        raise UserError(f"{tokenizer_dir}: the tokenizer has {size} tokens but "
                        f"{spec.path} [target] vocab_size is {spec.vocab_size}")
    if not 0 <= mask_id < spec.vocab_size:
        raise UserError(f"{where} is outside the vocabulary [0, {spec.vocab_size})")
    lines = []
    own = getattr(tokenizer, "mask_token_id", None)
    if own is not None and own != mask_id:
        warn(f"{where} is not the tokenizer's mask token "
             f"{tokenizer.mask_token!r} (id {own})")
    if mask_id >= size:
        lines.append(f"mask_token_id {mask_id}: an embedding row past the "
                     f"tokenizer's {size} tokens (never produced by it)")
        return lines
    token = tokenizer.convert_ids_to_tokens(mask_id)
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    added = getattr(tokenizer, "added_tokens_decoder", {}) or {}
    if mask_id == own:
        lines.append(f"mask_token_id {mask_id}: the tokenizer's mask token {token!r}")
    elif mask_id in special or mask_id in added:
        lines.append(f"mask_token_id {mask_id}: the tokenizer's special token {token!r}")
    else:
        warn(f"{where} is the tokenizer's regular token {token!r}; ordinary text "
             "can produce it (tokens fails if the data does)")
        lines.append(f"mask_token_id {mask_id}: the regular token {token!r}")
    return lines
