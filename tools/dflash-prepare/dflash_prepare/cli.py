"""The command line: `dflash-prepare tokens|features|check|regenerate|serve-check`."""
import argparse
import contextlib
import json
import os
import signal
import sys

from .errors import PROG, CheckFailed, UserError

DESCRIPTION = """\
Turns chat data into the shards a DFlash trainer reads (docs/data.md):
  tokens    chat JSONL -> token shards (input_ids, loss_mask on the assistant
            tokens from the tokenizer's own chat template; --pack adds
            position_ids)
  features  token shards -> feature shards (the target's hidden states at the
            spec's tapped layers)
  check     validates every row of a shard directory against a spec
  regenerate  chat JSONL -> chat JSONL with the target's own answers (an
            OpenAI-compatible server such as vLLM or SGLang, or transformers)
  serve-check  greedy DFlash speculative decoding of an exported drafter
            against its target: acceptance length, and the text checked
            against the target's own greedy decoding
Exit status: 0 done, 1 a check failed, 2 bad usage or input."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        self.print_usage(sys.stderr)
        print(f"{PROG}: error: {message}", file=sys.stderr)
        sys.exit(2)


def _number(convert, noun, accept, problem):
    """An argparse type: `convert` the text, then refuse what `accept` does
    not, saying `problem` of the value."""
    def parse(text):
        try:
            value = convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"'{text}' is not {noun}") from None
        if not accept(value):
            raise argparse.ArgumentTypeError(f"{value} {problem}")
        return value
    return parse


_positive = _number(int, "an integer", lambda v: v >= 1, "is not positive")
_non_negative = _number(int, "an integer", lambda v: v >= 0, "is negative")
_probability = _number(float, "a number", lambda v: 0 < v <= 1, "is not in (0, 1]")
_non_negative_float = _number(float, "a number", lambda v: v >= 0, "is negative")
_positive_float = _number(float, "a number", lambda v: v > 0, "is not positive")


def _template_option(text):
    """KEY=VALUE, the value read as json where it is (true, 3, "x")."""
    key, sep, value = text.partition("=")
    if not sep or not key.isidentifier():
        raise argparse.ArgumentTypeError(f"'{text}' is not KEY=VALUE")
    try:
        return key, json.loads(value)
    except ValueError:
        return key, value


@contextlib.contextmanager
def _sigterm_as_interrupt():
    """SIGTERM (`kill`, a batch system's end of a job) stops a run as Ctrl-C
    does: the shard being written is dropped, the finished ones are kept and
    the run says so. A second SIGTERM ends the process at once."""
    def stop(signum, frame):
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def build_parser():
    parser = _Parser(prog=PROG, description=DESCRIPTION,
                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND",
                                     parser_class=_Parser)

    tokens = commands.add_parser(
        "tokens", help="chat JSONL -> token shards",
        description="Chat JSONL (OpenAI 'messages' or ShareGPT 'conversations', one "
        "conversation per line) -> token shards: input_ids, loss_mask (1 on exactly "
        "the assistant tokens, from the tokenizer's own chat template) and "
        "num_tokens; with --pack also position_ids. Reports what it read, wrote and "
        "dropped, and why. Continues an interrupted run in the same --out.")
    tokens.add_argument("inputs", nargs="+", metavar="JSONL", help="chat data files")
    tokens.add_argument("--spec", required=True, metavar="SPEC",
                        help="drafter spec (specs/*.toml): vocabulary, mask token, seq_len")
    tokens.add_argument("--tokenizer", required=True, metavar="DIR",
                        help="Hugging Face directory of the target's tokenizer")
    tokens.add_argument("--out", "-o", required=True, metavar="DIR",
                        help="output directory of the token shards")
    tokens.add_argument("--seq-len", type=_positive, metavar="S",
                        help="row length (default: the spec's [training] seq_len)")
    tokens.add_argument("--max-length", type=_positive, metavar="N",
                        help="longest conversation in tokens (default: the row length)")
    tokens.add_argument("--over-long", choices=["drop", "truncate"], default="drop",
                        help="what happens to a conversation longer than --max-length "
                        "(default: drop)")
    tokens.add_argument("--last-turn-only", action="store_true",
                        help="supervise only each conversation's last assistant turn")
    tokens.add_argument("--reasoning", choices=["keep", "drop"], default="keep",
                        help="keep the assistant's reasoning (reasoning_content, "
                        "<think>...</think>) where the template renders it, and "
                        "supervise it; or drop it from the data (default: keep)")
    tokens.add_argument("--supervise-prefill", action="store_true",
                        help="also supervise template text that a serving engine "
                        "writes into the prompt after the role header (Qwen3's empty "
                        "<think></think> before an answer without reasoning, which "
                        "enable_thinking=False prefills); not supervised by default")
    tokens.add_argument("--end-of-turn", action="append", metavar="TOKEN",
                        help="the text that ends an assistant turn, supervised with it "
                        "(repeatable; default: the tokenizer's eos token, "
                        "generation_config.json's and the usual end-of-turn tokens "
                        "the tokenizer has, such as <|im_end|> and <|eot_id|>)")
    tokens.add_argument("--pack", action="store_true",
                        help="pack several conversations into each row "
                        "(first-fit-decreasing), with position_ids")
    tokens.add_argument("--workers", type=_positive, default=min(8, os.cpu_count() or 1),
                        metavar="N", help="processes that render and tokenize; the "
                        "output is the same for any N (default: the cores, at most 8)")
    tokens.add_argument("--seed", type=_non_negative, default=0,
                        help="seed of the packing order's ties (default: 0)")
    tokens.add_argument("--rows-per-shard", type=_positive, default=1024, metavar="N",
                        help="rows in each shard file (default: 1024)")
    tokens.add_argument("--overwrite", action="store_true",
                        help="replace the shards of a different earlier run in --out")

    features = commands.add_parser(
        "features", help="token shards -> feature shards",
        description="Runs the Hugging Face target (bf16, CUDA when available) over "
        "token shards and writes feature shards: hidden_states [R, S, L*H] bf16, the "
        "residual stream after each tapped layer of the spec, each packed "
        "conversation run alone, zeros on padding. Rows with non-finite features "
        "are skipped and counted. Refuses to start without the disk space it needs. "
        "Continues an interrupted run in the same --out.")
    features.add_argument("--spec", required=True, metavar="SPEC", help="drafter spec")
    features.add_argument("--target", required=True, metavar="DIR",
                          help="Hugging Face directory of the target model")
    features.add_argument("--tokens", required=True, metavar="DIR",
                          help="directory of token shards (dflash-prepare tokens)")
    features.add_argument("--out", "-o", required=True, metavar="DIR",
                          help="output directory of the feature shards")
    features.add_argument("--device", default="auto",
                          help="torch device (default: cuda when available, else cpu)")
    features.add_argument("--rows-per-shard", type=_positive, metavar="N",
                          help="rows in each feature shard (default: about 1 GiB a shard)")
    features.add_argument("--batch-tokens", type=_positive, default=32768, metavar="N",
                          help="tokens (padding included) per forward pass (default: 32768)")
    features.add_argument("--overwrite", action="store_true",
                          help="replace the shards of a different earlier run in --out")

    check = commands.add_parser(
        "check", help="validate a shard directory against a spec",
        description="Validates every row of a directory of token or feature shards "
        "against a spec: metadata, dtypes and shapes, token ids inside the "
        "vocabulary, 0/1 flags, finite features (zero on padding), at least two "
        "consecutive supervised tokens (in one conversation when packed), and "
        "packed position_ids. Prints every bad row (file, row, reason); exit "
        "status 1 if there is any.")
    check.add_argument("directory", metavar="DIR", help="shard directory")
    check.add_argument("--spec", required=True, metavar="SPEC", help="drafter spec")

    regen = commands.add_parser(
        "regenerate", help="chat JSONL -> chat JSONL with the target's own answers",
        description="Replaces each assistant turn (or only the last) with the target's "
        "own answer to the conversation before it, keeping reasoning_content where the "
        "backend returns it. Backends: an OpenAI-compatible chat-completions server "
        "(vLLM, SGLang: --server URL --model NAME) or transformers' generate (--backend "
        "transformers --target DIR). Lines are appended as conversations complete; one "
        "run at a time writes an output (REGEN.jsonl.lock names the holder). The same "
        "command again continues: what must match is the inputs' content, --model "
        "(--target), sampling, --max-tokens, template options and --last-turn-only, not "
        "the server's address; a run that wrote no answer binds nothing. A conversation "
        "whose request fails after the retries, or whose answer is malformed, not UTF-8 "
        "or empty, is named, counted and left out (a rerun asks again). Before asking, "
        "the server must answer and list --model (GET /v1/models where offered). SIGINT "
        "or SIGTERM stops within seconds, keeping what is written and saving the "
        "report; a second signal ends it at once. Exit status: 0 done (failures named "
        "in REGEN.jsonl.state.json), 1 every conversation asked failed, 2 bad usage or "
        "input, --out in use or not writable (a full disk), the server unreachable, "
        "without --model or gone mid-run, 130 SIGINT, 143 SIGTERM.")
    regen.add_argument("inputs", nargs="+", metavar="JSONL", help="chat data files")
    regen.add_argument("--out", "-o", required=True, metavar="REGEN.jsonl",
                       help="output chat JSONL (OpenAI messages, one conversation a line)")
    regen.add_argument("--backend", choices=["server", "transformers"],
                       help="where the answers come from (default: server with --server, "
                       "else transformers)")
    regen.add_argument("--server", metavar="URL",
                       help="the server's root, its /v1, or its /v1/chat/completions")
    regen.add_argument("--model", metavar="NAME", help="the model name the server serves")
    regen.add_argument("--target", metavar="DIR",
                       help="Hugging Face directory of the target (--backend transformers)")
    regen.add_argument("--device", default="auto",
                       help="torch device of --backend transformers (default: cuda when "
                       "available)")
    regen.add_argument("--dtype", choices=["auto", "float32", "bfloat16"], default="auto",
                       help="arithmetic of --backend transformers (default: bfloat16 on "
                       "a GPU; float32 when the answers must be serve-check's float32 "
                       "greedy decoding token for token)")
    regen.add_argument("--temperature", type=_non_negative_float, default=0.0,
                       help="sampling temperature; 0 is greedy (default: 0)")
    regen.add_argument("--top-p", type=_probability, default=1.0, metavar="P",
                       help="nucleus sampling mass (default: 1)")
    regen.add_argument("--max-tokens", type=_positive, default=2048, metavar="N",
                       help="longest answer in tokens (default: 2048)")
    regen.add_argument("--template-option", dest="template_options", action="append",
                       type=_template_option, default=[], metavar="KEY=VALUE",
                       help="an option of the chat template, e.g. enable_thinking=false "
                       "(repeatable; the server gets them as chat_template_kwargs)")
    regen.add_argument("--concurrency", type=_positive, default=8, metavar="N",
                       help="requests in flight (the batch of --backend transformers; "
                       "default: 8)")
    regen.add_argument("--timeout", type=_positive_float, default=600.0, metavar="S",
                       help="seconds one answer may take, from connecting to its last "
                       "byte, before it is retried (default: 600)")
    regen.add_argument("--retries", type=_non_negative, default=4, metavar="N",
                       help="retries of a request after a timeout, a dropped connection, "
                       "429 or 5xx, with exponential backoff, or after the server's "
                       "Retry-After on 429 and 503 (at most 300 s) (default: 4)")
    regen.add_argument("--retry-backoff", type=_non_negative_float, default=1.0,
                       metavar="S", help="seconds before the first retry, doubled for "
                       "each further one, with jitter (default: 1)")
    regen.add_argument("--last-turn-only", action="store_true",
                       help="answer only each conversation's last assistant turn")
    regen.add_argument("--keep-empty-answers", action="store_true",
                       help="write conversations with an empty answer (no content, no "
                       "tool calls); by default they are counted and left out")
    regen.add_argument("--overwrite", action="store_true",
                       help="start over where --out holds another run's output")

    serve = commands.add_parser(
        "serve-check", help="speculative decoding of an exported drafter: acceptance",
        description="Greedy DFlash speculative decoding in PyTorch (docs/semantics.md): the "
        "target prefills each held-out prompt, the drafter proposes a block from the "
        "target's tapped features and the mask tokens, the target verifies it and keeps "
        "the accepted prefix and its bonus token. Reports the mean acceptance length per "
        "block and its histogram beside the drafter's eval tau (eval.json), and checks "
        "that the text equals the target's own greedy decoding. Exit status 1 if it "
        "does not.")
    serve.add_argument("--target", required=True, metavar="DIR",
                       help="Hugging Face directory of the target (and its tokenizer)")
    serve.add_argument("--drafter", required=True, metavar="DIR",
                       help="an exported drafter (RUN/final, RUN/best: config.json, "
                       "model.safetensors)")
    serve.add_argument("--prompts", required=True, metavar="HELD_OUT.jsonl",
                       help="chat JSONL; each conversation up to its last assistant turn "
                       "is a prompt")
    serve.add_argument("--num-prompts", type=_positive, default=64, metavar="N",
                       help="prompts to decode (default: 64)")
    serve.add_argument("--max-new-tokens", type=_positive, default=128, metavar="M",
                       help="tokens to generate a prompt (default: 128)")
    serve.add_argument("--template-option", dest="template_options", action="append",
                       type=_template_option, default=[], metavar="KEY=VALUE",
                       help="an option of the chat template, e.g. enable_thinking=false")
    serve.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32",
                       help="the target's and drafter's arithmetic (default: float32, "
                       "in which a block and one token at a time agree on the argmax)")
    serve.add_argument("--device", default="auto",
                       help="torch device (default: cuda when available)")
    serve.add_argument("--report", metavar="FILE.json",
                       help="also write the figures as json")
    return parser


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.command:
        parser.print_help(sys.stderr)
        return 2
    try:
        if args.command == "tokens":
            from . import tokens
            with _sigterm_as_interrupt():
                return tokens.run(args)
        if args.command == "features":
            from . import features
            with _sigterm_as_interrupt():
                return features.run(args)
        if args.command == "regenerate":
            from . import regenerate
            args.template_options = dict(args.template_options)
            return regenerate.run(args)
        if args.command == "serve-check":
            from . import serve_check
            args.template_options = dict(args.template_options)
            return serve_check.run(args)
        from . import check
        return check.run(args)
    except UserError as error:
        print(error.report(), file=sys.stderr)
        return error.exit_code
    except CheckFailed as error:
        return error.exit_code
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted; run the same command again to continue",
              file=sys.stderr)
        return 130
