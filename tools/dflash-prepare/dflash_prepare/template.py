"""Token ids and loss masks from the tokenizer's own chat template.

A conversation is rendered to text once with the template and tokenized once
(with character offsets). Its assistant spans come from that one render
(`spans`), and a token is supervised iff its characters overlap a span.
"""
import hashlib
import json
import os

import numpy as np

from . import spans as spans_module
from .errors import UserError, require, warn
from .render import (TemplateFailure, TokenizerRenderer,  # noqa: F401 (callers)
                     has_generation_markers, token_text)


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


def _read_json(path):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, json.JSONDecodeError):
        return None


def end_of_turn_tokens(directory):
    """The strings that end an assistant turn, from a tokenizer directory's
    files: the eos token, generation_config.json's eos tokens, and the
    usual end-of-turn tokens the tokenizer has as added tokens."""
    config = _read_json(os.path.join(directory, "tokenizer_config.json")) or {}
    added = {}
    for key, entry in (config.get("added_tokens_decoder") or {}).items():
        if isinstance(entry, dict) and token_text(entry) and str(key).isdigit():
            added[int(key)] = token_text(entry)
    for entry in (_read_json(os.path.join(directory, "tokenizer.json")) or {}).get(
            "added_tokens") or []:
        if isinstance(entry, dict) and isinstance(entry.get("id"), int) and token_text(entry):
            added.setdefault(entry["id"], token_text(entry))
    tokens = []
    eos = token_text(config.get("eos_token"))
    if eos:
        tokens.append(eos)
    generation = _read_json(os.path.join(directory, "generation_config.json")) or {}
    ids = generation.get("eos_token_id")
    for i in (ids if isinstance(ids, list) else [ids]):
        if isinstance(i, int) and i in added:
            tokens.append(added[i])
    present = set(added.values())
    tokens += [t for t in spans_module.KNOWN_END_OF_TURN if t in present]
    return tuple(dict.fromkeys(tokens))


class Encoded:
    def __init__(self, ids, mask, spans, messages):
        self.ids = ids            # np.int32 [n]
        self.mask = mask          # np.uint8 [n]
        self.spans = spans        # spans.Spans: the render and its spans
        self.messages = messages  # the messages as rendered


def _content_null_as_empty(messages):
    """The messages with a null assistant content as "" (for templates that
    cannot take the null of an OpenAI tool-call turn), or None where no
    content is null."""
    if not any(m.get("content", "") is None for m in messages):
        return None
    return [dict(m, content="") if m.get("content", "") is None else m for m in messages]


class ChatEncoder:
    """Encodes normalised conversations with one tokenizer's template."""

    def __init__(self, tokenizer, renderer, settings):
        self.tokenizer = tokenizer
        self.renderer = renderer
        self.settings = settings

    def spans(self, conversation):
        """(messages as rendered, spans.Spans); TemplateFailure or
        spans.NoSpans for a conversation that cannot be used."""
        messages = conversation.messages
        try:
            return messages, spans_module.find_spans(self.renderer, messages,
                                                     conversation.tools, self.settings)
        except TemplateFailure as failure:
            # Only where the null itself is what the template cannot take
            # (Qwen3 looks for </think> in it): any other failure stands.
            retry = _content_null_as_empty(messages) if "NoneType" in str(failure) else None
            if retry is None:
                raise
            return retry, spans_module.find_spans(self.renderer, retry,
                                                  conversation.tools, self.settings)

    def encode(self, conversation):
        messages, found = self.spans(conversation)
        encoding = self.tokenizer(found.text, add_special_tokens=False,
                                  return_offsets_mapping=True)
        ids = np.asarray(encoding["input_ids"], dtype=np.int64)
        offsets = np.asarray(encoding["offset_mapping"], dtype=np.int64).reshape(-1, 2)
        return Encoded(ids.astype(np.int32), spans_to_mask(offsets, found.spans),
                       found, messages)


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
