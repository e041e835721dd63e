"""`dflash-prepare serve-check`: greedy DFlash speculative decoding of an
exported drafter against its target, the way a server verifies blocks, and
the acceptance length it gets (docs/data.md, "The acceptance a server sees").

One step, with `anchor` the position of the last token kept (the target
has not run it yet, so its features do not exist):
1. the drafter proposes bs - 1 tokens from the context (the target's
   features of positions < anchor) and the block [token, mask, ...];
2. the target runs [token, proposals] at anchor .. anchor + bs - 1 and
   predicts the token after each;
3. the proposals that equal those predictions, from the first, are
   accepted, and the target's prediction after the last of them (the bonus
   token) is kept too: 1 + accepted tokens, the block's acceptance length;
4. the target's cache is cut back to the kept tokens, and their features
   join the context.
The text must be the target's own greedy decoding of the prompt; both are
computed here, and any difference is reported with where it starts.
"""
import json
import os
import sys
import time

from . import chat, template
from .drafter import Drafter
from .errors import UserError, note, require, require_torch2


class Target:
    """A causal LM with a cache: `run(ids)` appends tokens and returns their
    logits [n, V] and tapped features [n, L*H]; `crop(n)` keeps the first n
    positions."""

    def __init__(self, model, taps, torch):
        self.model, self.taps, self.torch = model, taps, torch
        self.cache = None

    def reset(self):
        transformers = sys.modules["transformers"]
        self.cache = transformers.DynamicCache()

    def run(self, ids):
        torch = self.torch
        with torch.no_grad():
            out = self.model(input_ids=torch.tensor([ids], device=self.model.device),
                             past_key_values=self.cache, use_cache=True,
                             output_hidden_states=True)
        features = torch.cat([out.hidden_states[tap + 1][0] for tap in self.taps], -1)
        return out.logits[0], features

    def crop(self, length):
        self.cache.crop(length)


def greedy(target, prompt, max_new, stops):
    """The target's own greedy continuation of `prompt` (token ids)."""
    target.reset()
    logits, _ = target.run(prompt)
    out = [int(logits[-1].argmax())]
    while len(out) < max_new and out[-1] not in stops:
        logits, _ = target.run([out[-1]])
        out.append(int(logits[-1].argmax()))
    return out


def speculative(target, drafter, prompt, max_new, stops):
    """(tokens, acceptance length of each block) of greedy DFlash decoding."""
    target.reset()
    logits, features = target.run(prompt)
    context = drafter.context()
    context.append(features)
    out = [int(logits[-1].argmax())]
    blocks = []
    while len(out) < max_new and out[-1] not in stops:
        anchor = len(prompt) + len(out) - 1
        proposals = drafter.propose(context, out[-1], anchor)
        logits, features = target.run([out[-1]] + proposals)
        predicted = logits.argmax(-1).tolist()
        accepted = 0
        while accepted < len(proposals) and proposals[accepted] == predicted[accepted]:
            if proposals[accepted] in stops:  # a server stops at the end of the turn
                break
            accepted += 1
        kept = proposals[:accepted] + [predicted[accepted]]
        blocks.append(len(kept))
        context.append(features[:accepted + 1])
        target.crop(anchor + accepted + 1)
        out += kept
    for i, token in enumerate(out):
        if token in stops:
            out = out[:i + 1]
            break
    return out[:max_new], blocks


def position_runs(target, drafter, prompt, answer):
    """1 + run of a block anchored at every answer position but the last,
    drafted from the target's features of `prompt + answer` and counted
    against `answer` itself: docs/semantics.md section 10's tau with the anchors
    of section 2, on the target's own text."""
    target.reset()
    full = prompt + answer
    _, features = target.run(full)
    context = drafter.context()
    context.append(features[:len(prompt)])
    runs = []
    for anchor in range(len(prompt), len(full) - 1):
        proposals = drafter.propose(context, full[anchor], anchor)
        run = 0
        while (run < len(proposals) and anchor + 1 + run < len(full)
               and proposals[run] == full[anchor + 1 + run]):
            run += 1
        runs.append(1 + run)
        context.append(features[anchor:anchor + 1])
    return runs


def serving_order(runs):
    """The runs a server meets: it drafts at the first position, then after
    each block's kept tokens, so it meets hard positions more often."""
    met, at = [], 0
    while at < len(runs):
        met.append(runs[at])
        at += runs[at]
    return met


def read_prompts(path, tokenizer, options, count):
    """Up to `count` prompts of a chat JSONL: each conversation up to its last
    assistant turn, with the generation prompt, as token ids."""
    drops = chat.Drops()
    prompts = []
    for conversation in chat.read_conversations([path], drops):
        messages = conversation.messages
        last = max(i for i, m in enumerate(messages) if m["role"] == "assistant")
        try:
            text = tokenizer.apply_chat_template(
                messages[:last], tools=conversation.tools, tokenize=False,
                add_generation_prompt=True, **options)
        except Exception as error:  # jinja2 errors, the template's raise_exception
            note(f"{conversation.where}: the chat template failed ({error}); skipped")
            continue
        prompts.append((conversation.where,
                        tokenizer(text, add_special_tokens=False)["input_ids"]))
        if len(prompts) == count:
            break
    if not prompts:
        raise UserError(f"{path}: no usable prompt (every line lacks an assistant turn or "
                        "failed to parse)")
    return prompts


def eval_tau_of(directory):
    path = os.path.join(directory, "eval.json")
    try:
        with open(path) as f:
            value = json.load(f).get("eval_tau")
    except (OSError, ValueError, AttributeError):
        return None
    return float(value) if isinstance(value, (int, float)) else None


def run(args):
    torch = require_torch2("serve-check")
    transformers = require("transformers", "serve-check")
    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = getattr(torch, args.dtype)
    torch.backends.cuda.matmul.allow_tf32 = False
    tokenizer = template.load_tokenizer(args.target)
    try:
        model = transformers.AutoModelForCausalLM.from_pretrained(
            args.target, dtype=dtype, local_files_only=True).to(device).eval()
    except Exception as error:  # transformers raises many kinds here
        first = (str(error).strip().splitlines() or [type(error).__name__])[0]
        raise UserError(f"{args.target}: cannot load the target model: {first}") from None
    drafter = Drafter(args.drafter, model.get_input_embeddings().weight.detach(),
                      model.get_output_embeddings().weight.detach(), torch, device, dtype)
    layers = model.config.num_hidden_layers
    bad = [t for t in drafter.target_layer_ids if not 0 <= t < layers]
    if bad:
        raise UserError(f"{args.drafter}/config.json: target_layer_ids {bad} are not "
                        f"layers of the {layers}-layer target {args.target}")
    stops = {tokenizer.convert_tokens_to_ids(t) for t in template.end_of_turn_tokens(args.target)}
    stops.discard(None)
    target = Target(model, drafter.target_layer_ids, torch)
    prompts = read_prompts(args.prompts, tokenizer, args.template_options, args.num_prompts)
    note(f"{len(prompts)} prompts, {args.max_new_tokens} new tokens each, block size "
         f"{drafter.block_size}, {args.dtype} on {device}")
    blocks, differ, everywhere, replayed = [], [], [], []
    seconds = {"greedy": 0.0, "speculative": 0.0}
    tokens = {"greedy": 0, "speculative": 0}
    for number, (where, prompt) in enumerate(prompts, 1):
        began = time.perf_counter()
        plain = greedy(target, prompt, args.max_new_tokens, stops)
        seconds["greedy"] += time.perf_counter() - began
        began = time.perf_counter()
        spec, accepted = speculative(target, drafter, prompt, args.max_new_tokens, stops)
        seconds["speculative"] += time.perf_counter() - began
        runs = position_runs(target, drafter, prompt, plain)
        everywhere += runs
        replayed += serving_order(runs)
        tokens["greedy"] += len(plain)
        tokens["speculative"] += len(spec)
        blocks += accepted
        if spec != plain:
            first = next((i for i, (a, b) in enumerate(zip(spec, plain)) if a != b),
                         min(len(spec), len(plain)))
            differ.append({"prompt": where, "first_difference": first,
                           "speculative_tokens": len(spec), "greedy_tokens": len(plain)})
        mean = sum(blocks) / len(blocks) if blocks else float("nan")
        print(f"\rserve-check: {number}/{len(prompts)} prompts, acceptance {mean:.3f}",
              end="", file=sys.stderr, flush=True)
    print("", file=sys.stderr)
    bs = drafter.block_size
    histogram = [blocks.count(n) for n in range(1, bs + 1)]
    mean = sum(blocks) / len(blocks) if blocks else float("nan")
    tau = eval_tau_of(args.drafter)
    position_tau = sum(everywhere) / len(everywhere) if everywhere else float("nan")
    replay = sum(replayed) / len(replayed) if replayed else float("nan")
    # A block at a position of run r covers r tokens, so a server drafts at
    # about 1/r of such positions: the harmonic mean predicts what it sees.
    harmonic = (len(everywhere) / sum(1 / r for r in everywhere) if everywhere
                else float("nan"))
    report = {"prompts": len(prompts), "max_new_tokens": args.max_new_tokens,
              "block_size": bs, "blocks": len(blocks), "acceptance_length": mean,
              "histogram": histogram, "eval_tau": tau,
              "acceptance_over_eval_tau": mean / tau if tau else None,
              "position_tau": position_tau, "position_histogram":
              [everywhere.count(n) for n in range(1, bs + 1)],
              "replayed_acceptance": replay, "harmonic_position_tau": harmonic,
              "text_identical": not differ, "differing_prompts": differ,
              "dtype": args.dtype,
              "tokens_per_s": {k: tokens[k] / seconds[k] if seconds[k] else None
                               for k in tokens}}
    if args.report:
        with open(args.report, "w") as f:
            json.dump(report, f, indent=1)
    print(f"serve-check: {args.drafter} against {args.target}")
    print(f"  mean acceptance length per block: {mean:.3f} over {len(blocks)} blocks "
          f"(block size {bs})")
    print(f"  eval tau (eval.json): {'%.3f' % tau if tau else 'none (no eval.json)'}"
          + (f"; acceptance / eval tau = {mean / tau:.3f}" if tau else ""))
    print(f"  tau at every position of the greedy text (training's estimator): "
          f"{position_tau:.3f} (harmonic mean {harmonic:.3f}); those runs met in serving "
          f"order: {replay:.3f}")
    print("  histogram (accepted tokens a block, 1 .. bs): " +
          " ".join(f"{n}:{c}" for n, c in enumerate(histogram, 1)))
    print(f"  text identical to greedy decoding: "
          f"{'yes' if not differ else 'NO, %d of %d prompts differ' % (len(differ), len(prompts))}")
    for entry in differ[:5]:
        print(f"    {entry['prompt']}: first difference at new token "
              f"{entry['first_difference']}")
    return 1 if differ else 0
