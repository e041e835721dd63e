#!/usr/bin/env python3
"""How fast `dflash-prepare tokens` reads chat data with real tokenizers:
the generated multi-turn conversations of the chat-template tests (system
prompts, reasoning, tool calls, unicode), COUNT of them, through the whole
command (render, spans, tokenize, pack, write) for each tokenizer of the
npm cache (scripts/setup.sh). Needs transformers.

    bench/prepare/tokens_bench.py [--count 3000]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TESTS = os.path.join(ROOT, "tools", "dflash-prepare", "tests")
sys.path.insert(0, TESTS)

import chat_cases  # noqa: E402

SPEC = """\
name = "bench-{name}"
[target]
model = "bench/{name}"
num_layers = 4
hidden_size = 64
vocab_size = 160000
layer_ids = [0, 2]
[drafter]
num_layers = 1
intermediate_size = 128
num_heads = 2
num_kv_heads = 1
head_dim = 32
block_size = 4
mask_token_id = 159999
[training]
seq_len = 4096
anchors_per_row = 8
"""


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, default=3000)
    args = parser.parse_args()
    cache = chat_cases.tokenizer_cache()
    if not cache:
        sys.exit("tokens_bench: the npm tokenizers are not fetched (scripts/setup.sh)")
    with tempfile.TemporaryDirectory(prefix="tokens-bench-") as work:
        data = os.path.join(work, "chat.jsonl")
        with open(data, "w", encoding="utf-8") as f:
            for messages in chat_cases.generate(args.count, seed=11):
                f.write(json.dumps({"messages": messages}, ensure_ascii=False) + "\n")
        print("| tokenizer | conversations | tokens | supervised | spans from | seconds "
              "| conversations/s | tokens/s |")
        print("|---|---|---|---|---|---|---|---|")
        for name in chat_cases.TOKENIZERS:
            spec = os.path.join(work, f"{name}.toml")
            with open(spec, "w") as f:
                f.write(SPEC.format(name=name))
            out = os.path.join(work, name)
            began = time.perf_counter()
            result = subprocess.run(
                [sys.executable, os.path.join(ROOT, "tools", "dflash-prepare", "dflash-prepare"),
                 "tokens", data, "--spec", spec, "--tokenizer", os.path.join(cache, name),
                 "--out", out, "--pack"], capture_output=True, text=True)
            seconds = time.perf_counter() - began
            if result.returncode != 0:
                sys.exit(f"tokens_bench: {name}: {result.stderr}")
            with open(os.path.join(out, "manifest.json")) as f:
                report = json.load(f)["report"]
            print(f"| {name} | {report['conversations']} | {report['tokens']} | "
                  f"{100 * report['supervised_share']:.1f}% | {report['spans_from']} | "
                  f"{seconds:.1f} | {report['conversations'] / seconds:.0f} | "
                  f"{report['tokens'] / seconds:.0f} |")


if __name__ == "__main__":
    main()
