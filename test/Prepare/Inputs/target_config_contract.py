"""The target-config contract: `dflashc SPEC --target DIR` and
`dflash-prepare features` (dflash_prepare.features.read_target_config) check
the target's config.json against the spec alike. For each spec given, on a
config.json that agrees with it and on variants that break one field (hidden
size, vocabulary, layer count, tying, a missing or mistyped field, positions
shorter than the spec's rows, the same under text_config), both accept, or both refuse naming the same field.

  target_config_contract.py WORK_DIR SPEC...

dflashc is run as a compile (`-o OUT`) where it must refuse, and must stop
before writing OUT; where it must accept, with --emit=spec, which checks the
target the same way and runs no nvcc. Needs dflashc on PATH and
dflash_prepare importable (lit sets PYTHONPATH). Exit status 1 on any
disagreement, each named with the spec, the case and the fields."""
import json
import os
import re
import subprocess
import sys

from dflash_prepare import features
from dflash_prepare.errors import UserError
from dflash_prepare.spec import load_spec

PROG = "target-config-contract"

# What dflashc needs to build the target but does not compare with the spec.
COMPILE_ONLY = {"model_type": "qwen3", "intermediate_size": 128, "num_attention_heads": 2,
                "num_key_value_heads": 1, "head_dim": 32}


def without(config, key):
    return {k: v for k, v in config.items() if k != key}


def cases(spec):
    """(case, config.json object, whether the spec must refuse it)."""
    agreeing = {**COMPILE_ONLY, "hidden_size": spec.hidden_size,
                "vocab_size": spec.vocab_size,
                "num_hidden_layers": spec.target_num_layers,
                "tie_word_embeddings": spec.tie_word_embeddings}
    tied = spec.tie_word_embeddings
    # A multimodal config: the language model's fields under text_config.
    def nested(text, **top):
        return {"model_type": "qwen3_vl", **top, "text_config": text}
    return [
        ("agrees", agreeing, False),
        ("wrong hidden_size", {**agreeing, "hidden_size": spec.hidden_size * 2}, True),
        ("wrong vocab_size", {**agreeing, "vocab_size": spec.vocab_size - 1}, True),
        ("too few layers", {**agreeing, "num_hidden_layers": spec.target_num_layers - 1}, True),
        ("too many layers", {**agreeing, "num_hidden_layers": spec.target_num_layers + 1}, True),
        ("tie_word_embeddings disagrees", {**agreeing, "tie_word_embeddings": not tied}, True),
        # Absent means untied on both sides.
        ("tie_word_embeddings absent", without(agreeing, "tie_word_embeddings"), tied),
        ("tie_word_embeddings not a boolean", {**agreeing, "tie_word_embeddings": "yes"}, True),
        ("hidden_size missing", without(agreeing, "hidden_size"), True),
        ("vocab_size a string", {**agreeing, "vocab_size": str(spec.vocab_size)}, True),
        ("text_config agrees, the top level does not",
         nested(agreeing, hidden_size=spec.hidden_size + 1), False),
        ("text_config: wrong hidden_size",
         nested({**agreeing, "hidden_size": spec.hidden_size + 1},
                hidden_size=spec.hidden_size), True),
        ("text_config: num_hidden_layers missing",
         nested(without(agreeing, "num_hidden_layers"),
                num_hidden_layers=spec.target_num_layers), True),
        ("text_config: tie_word_embeddings disagrees",
         nested({**agreeing, "tie_word_embeddings": not tied}, tie_word_embeddings=tied), True),
        # Rows no longer than the target's positions.
        ("max_position_embeddings at seq_len",
         {**agreeing, "max_position_embeddings": spec.seq_len}, False),
        ("max_position_embeddings below seq_len",
         {**agreeing, "max_position_embeddings": spec.seq_len - 1}, True),
        ("max_position_embeddings not an integer",
         {**agreeing, "max_position_embeddings": "4096"}, True),
        ("text_config: max_position_embeddings below seq_len",
         nested({**agreeing, "max_position_embeddings": spec.seq_len - 1},
                max_position_embeddings=spec.seq_len), True),
    ]


# The config field a refusal names: the first quoted name after the file.
FIELD = re.compile(r"config\.json: (?:has no )?'([^']+)'")


def field_of(message):
    match = FIELD.search(message)
    return match.group(1) if match else None


def dflashc_refusal(spec_path, target, must_refuse):
    """dflashc's error message, or None where it accepts the target."""
    if must_refuse:
        out = os.path.join(target, "out")
        command = ["dflashc", spec_path, "--target", target, "-o", out]
    else:
        command = ["dflashc", spec_path, "--target", target, "--emit=spec"]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode == 0:
        return None
    if must_refuse and os.path.exists(out):
        raise AssertionError(f"{' '.join(command)}: refused but wrote {out}")
    return result.stderr.strip().removeprefix("dflashc: error: ")


def python_refusal(spec, target):
    try:
        features.read_target_config(target, spec)
        return None
    except UserError as error:
        return str(error)


def main(argv):
    if len(argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    work, spec_paths = argv[1], argv[2:]
    problems, refused = [], 0
    for spec_path in spec_paths:
        spec = load_spec(spec_path)
        for index, (case, config, must_refuse) in enumerate(cases(spec)):
            target = os.path.join(work, f"{spec.name}-{index}")
            os.makedirs(target, exist_ok=True)
            with open(os.path.join(target, "config.json"), "w") as f:
                json.dump(config, f)
            try:
                theirs = dflashc_refusal(spec_path, target, must_refuse)
            except AssertionError as error:
                problems.append(f"{spec_path}: {case}: {error}")
                continue
            ours = python_refusal(spec, target)
            where = f"{spec_path}: {case} ({target}/config.json)"
            if must_refuse and (theirs is None or ours is None):
                problems.append(f"{where}: must be refused; dflashc: {theirs or 'accepts it'}; "
                                f"dflash-prepare: {ours or 'accepts it'}")
            elif not must_refuse and (theirs or ours):
                problems.append(f"{where}: must be accepted; dflashc: {theirs or 'accepts it'}; "
                                f"dflash-prepare: {ours or 'accepts it'}")
            elif must_refuse and field_of(theirs) != field_of(ours):
                problems.append(f"{where}: dflashc names '{field_of(theirs)}' ({theirs}), "
                                f"dflash-prepare names '{field_of(ours)}' ({ours})")
            elif must_refuse:
                refused += 1
                print(f"{PROG}: {spec.name}: {case}: both refuse, naming '{field_of(ours)}'")
            else:
                print(f"{PROG}: {spec.name}: {case}: both accept")
    for problem in problems:
        print(f"{PROG}: error: {problem}", file=sys.stderr)
    if problems:
        return 1
    print(f"{PROG}: {len(spec_paths)} specs, {refused} bad configs refused alike")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
