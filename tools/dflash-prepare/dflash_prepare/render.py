"""Chat-template renderers: conversation -> the text the target sees.

Two renderers with one interface (`render(messages, tools,
add_generation_prompt, template=None, **options)`, raising
`TemplateFailure` for one conversation the template cannot render):

- `TokenizerRenderer`: the tokenizer's own `apply_chat_template` (what
  `tokens` uses where transformers is installed).
- `JinjaRenderer`: the template rendered with jinja2 in the environment
  transformers builds (sandboxed, trim_blocks and lstrip_blocks,
  loopcontrols, its `tojson`, `raise_exception` and `strftime_now`, the
  special tokens as variables), from a tokenizer directory's files alone.
  The CI tests render real templates with it where transformers is missing;
  the H200 check holds it to transformers' text.
"""
import datetime
import json
import os
import re

from .errors import UserError, require

_GENERATION = re.compile(r"\{%(-?)\s*(generation|endgeneration)\s*(-?)%\}")

# Attributes of a tokenizer that transformers hands to the template.
SPECIAL_TOKEN_KEYS = ("bos_token", "eos_token", "unk_token", "sep_token",
                      "pad_token", "cls_token", "mask_token")


class TemplateFailure(Exception):
    """The template could not render one conversation (it is dropped)."""


def has_generation_markers(template):
    return bool(_GENERATION.search(template or ""))


def replace_generation_markers(template, opening="", closing=""):
    """The template with each `{% generation %}` tag replaced by an `if true`
    block printing `opening` (and `{% endgeneration %}` by one printing
    `closing`), keeping the tags' whitespace control."""
    def replace(match):
        left, kind, right = match.groups()
        text = opening if kind == "generation" else closing
        printed = f"{{{{ '{text}' }}}}" if text else ""
        if kind == "generation":
            return f"{{%{left} if true %}}{printed}{{% if true {right}%}}"
        return f"{{%{left} endif %}}{printed}{{% endif {right}%}}"
    return _GENERATION.sub(replace, template)


def _failure(error):
    text = str(error).strip()
    return TemplateFailure(text.splitlines()[0] if text else type(error).__name__)


class TokenizerRenderer:
    """Renders with a transformers tokenizer's `apply_chat_template`."""

    def __init__(self, tokenizer, template):
        self.tokenizer = tokenizer
        self.template = template

    def render(self, messages, tools=None, add_generation_prompt=False,
               template=None, **options):
        try:
            text = self.tokenizer.apply_chat_template(
                messages, tools=tools, tokenize=False,
                add_generation_prompt=add_generation_prompt,
                chat_template=template or self.template, **options)
        except Exception as error:  # jinja2 errors, the template's raise_exception
            raise _failure(error) from None
        if not isinstance(text, str):
            raise TemplateFailure(f"the template rendered a {type(text).__name__}")
        return text


def token_text(value):
    """A token of tokenizer_config.json or tokenizer.json: a string or an
    AddedToken object ({"content": ...}); None if neither."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) and value else None


def read_tokenizer_config(directory):
    """The chat template and the special tokens of a tokenizer directory
    (tokenizer_config.json, chat_template.jinja), as transformers reads them."""
    path = os.path.join(directory, "tokenizer_config.json")
    try:
        with open(path, encoding="utf-8") as f:
            config = json.load(f)
    except OSError as error:
        raise UserError(f"{path}: cannot read: {error.strerror}") from None
    except json.JSONDecodeError as error:
        raise UserError(f"{path}:{error.lineno}: malformed json: {error.msg}") from None
    template = config.get("chat_template")
    if isinstance(template, list):  # named templates: [{"name", "template"}]
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    jinja_path = os.path.join(directory, "chat_template.jinja")
    if os.path.isfile(jinja_path):
        with open(jinja_path, encoding="utf-8") as f:
            template = f.read()
    if not isinstance(template, str) or not template.strip():
        raise UserError(f"{directory}: the tokenizer has no chat template "
                        "('chat_template' in tokenizer_config.json or "
                        "chat_template.jinja)")
    special = {key: token_text(config.get(key)) for key in SPECIAL_TOKEN_KEYS}
    special = {key: value for key, value in special.items() if value is not None}
    extra = [token_text(t) for t in config.get("additional_special_tokens") or []]
    special["additional_special_tokens"] = [t for t in extra if t is not None]
    return template, special


class JinjaRenderer:
    """Renders a chat template with jinja2 as transformers does."""

    def __init__(self, template, special_tokens):
        self.jinja2 = require("jinja2", "rendering the chat template")
        require("jinja2.ext", "rendering the chat template")
        require("jinja2.sandbox", "rendering the chat template")
        self.template = template
        self.special_tokens = dict(special_tokens)
        self._compiled = {}

    @classmethod
    def from_directory(cls, directory):
        template, special = read_tokenizer_config(directory)
        return cls(template, special)

    def _compile(self, template):
        compiled = self._compiled.get(template)
        if compiled is None:
            jinja2 = self.jinja2

            def raise_exception(message):
                raise jinja2.exceptions.TemplateError(message)

            def tojson(value, ensure_ascii=False, indent=None, separators=None,
                       sort_keys=False):
                # transformers' filter: json.dumps without jinja's HTML escaping.
                return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent,
                                  separators=separators, sort_keys=sort_keys)

            def strftime_now(format):
                return datetime.datetime.now().strftime(format)

            env = jinja2.sandbox.ImmutableSandboxedEnvironment(
                trim_blocks=True, lstrip_blocks=True,
                extensions=[jinja2.ext.loopcontrols])
            env.filters["tojson"] = tojson
            env.globals["raise_exception"] = raise_exception
            env.globals["strftime_now"] = strftime_now
            try:
                # Generation markers render their body unchanged here.
                compiled = env.from_string(replace_generation_markers(template))
            except jinja2.exceptions.TemplateSyntaxError as error:
                raise UserError(f"the chat template does not parse: line "
                                f"{error.lineno}: {error.message}") from None
            self._compiled[template] = compiled
        return compiled

    def render(self, messages, tools=None, add_generation_prompt=False,
               template=None, **options):
        compiled = self._compile(template or self.template)
        variables = dict(self.special_tokens)
        variables.update(options)
        try:
            return compiled.render(messages=messages, tools=tools, documents=None,
                                   add_generation_prompt=add_generation_prompt,
                                   **variables)
        except Exception as error:  # jinja2 errors, the template's raise_exception
            raise _failure(error) from None
