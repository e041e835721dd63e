"""The command line: `dflash-prepare tokens|features|check`."""
import argparse
import os
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
Exit status: 0 done, 1 a check failed, 2 bad usage or input."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        self.print_usage(sys.stderr)
        print(f"{PROG}: error: {message}", file=sys.stderr)
        sys.exit(2)


def _positive(text):
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not positive")
    return value


def _non_negative(text):
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not an integer") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} is negative")
    return value


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
            return tokens.run(args)
        if args.command == "features":
            from . import features
            return features.run(args)
        from . import check
        return check.run(args)
    except UserError as error:
        print(f"{PROG}: error: {error}", file=sys.stderr)
        return error.exit_code
    except CheckFailed as error:
        return error.exit_code
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted; run the same command again to continue",
              file=sys.stderr)
        return 130
