"""`dflash-prepare tokens`: chat JSONL -> token shards."""
import collections
import contextlib
import json
import multiprocessing
import os
import signal
import sys

from . import chat, output_lock, packing, progress, shards, spans, template
from .errors import UserError, note, warn
from .spec import load_spec

FORMAT = "dflash-token-shard"


def _tokenizer_identity(directory):
    """Hashes of the tokenizer's files: a changed tokenizer is another run."""
    files = {}
    try:
        names = sorted(os.listdir(directory))
    except OSError as error:
        raise UserError(f"{directory}: cannot list: {error.strerror or error}") from None
    for name in names:
        path = os.path.join(directory, name)
        if os.path.isfile(path) and (name.startswith("tokenizer") or
                                     name.endswith((".jinja", ".json", ".model",
                                                    ".txt", ".tiktoken"))):
            files[name] = progress.file_sha256(path)
    return files


def token_shard_metadata(spec, settings):
    meta = spec.shard_metadata()
    meta.update({
        "format": FORMAT,
        "format_version": "1",
        "spec": spec.name,
        "vocab_size": str(spec.vocab_size),
        "mask_token_id": str(spec.mask_token_id),
    })
    meta.update({k: str(v) for k, v in settings.items()})
    return meta


class Encodings:
    """The kept conversations' (ids, mask) and what was counted on the way."""

    def __init__(self):
        self.sequences = []
        self.truncated = 0
        self.mask_hits, self.first_hit = 0, None
        self.methods = collections.Counter()  # span method -> conversations
        self.turns = collections.Counter()    # present, supervised, without_end


# The encoder of the worker processes (inherited through fork).
_WORKER_ENCODER = None


def _encode_one(conversation):
    """What a worker sends back: (Encoded without its text, None, None), or
    (None, drop reason, why)."""
    try:
        encoded = _WORKER_ENCODER.encode(conversation)
    except template.TemplateFailure as failure:
        return None, "template-error", f"chat template: {failure}"
    except spans.NoSpans as failure:
        return None, "no-spans", str(failure)
    encoded.spans.text = None
    encoded.messages = None
    return encoded, None, None


# Conversations a worker encodes and sends back at a time.
_CHUNK = 32


def _worker(conversations, chunks, connection):
    """A worker process: encodes its chunks of `conversations` in order and
    sends each chunk's results (or the exception that ended it)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)   # Ctrl-C is the main process's
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # not the inherited handler
    try:
        for begin, end in chunks:
            connection.send([_encode_one(c) for c in conversations[begin:end]])
    except Exception as error:
        connection.send(error)


@contextlib.contextmanager
def _signals_held():
    """Ctrl-C and SIGTERM wait until the block is done, then stop the run.
    Around fork: a KeyboardInterrupt raised in os.fork's after-fork hooks is
    printed and dropped (the run went on), and a new worker runs on the
    main process's handlers until it sets its own."""
    held = []
    stopping = (signal.SIGINT, signal.SIGTERM)
    previous = {number: signal.signal(number, lambda number, frame: held.append(number))
                for number in stopping}
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
    if held:
        raise KeyboardInterrupt


def _encodings(encoder, conversations, workers):
    """Each conversation's _encode_one result, in order, from `workers`
    processes (1: this one).

    Each worker is a forked process with a pipe of its own and a fixed share
    of the chunks (chunk i to worker i % workers); nothing is shared between
    them, so a worker killed at any moment (Ctrl-C, a SIGTERM to the whole
    process group, the OOM killer) cannot leave a lock held, as it could in
    a multiprocessing.Pool, whose terminate() then hung."""
    global _WORKER_ENCODER
    _WORKER_ENCODER = encoder
    if workers <= 1 or len(conversations) < 2 * workers:
        yield from map(_encode_one, conversations)
        return
    # fork: the workers inherit the conversations, the tokenizer and the
    # template; each tokenizes on its own thread only.
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    context = multiprocessing.get_context("fork")
    chunks = [(begin, min(begin + _CHUNK, len(conversations)))
              for begin in range(0, len(conversations), _CHUNK)]
    processes, pipes = [], []
    try:
        with _signals_held():
            for index in range(workers):
                receiving, sending = context.Pipe(duplex=False)
                process = context.Process(target=_worker, daemon=True, args=(
                    conversations, chunks[index::workers], sending))
                process.start()
                sending.close()  # the worker's end: its exit is then our EOF
                processes.append(process)
                pipes.append(receiving)
        for index in range(len(chunks)):
            try:
                results = pipes[index % workers].recv()
            except EOFError:
                process = processes[index % workers]
                process.join()
                if process.exitcode in (-signal.SIGTERM, -signal.SIGINT):
                    raise KeyboardInterrupt from None  # the run is being stopped
                raise UserError(f"a worker process that tokenizes ended (exit status "
                                f"{process.exitcode}; killed for memory?); try fewer "
                                "--workers") from None
            if isinstance(results, Exception):
                raise results
            yield from results
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            process.join()
        for pipe in pipes:
            pipe.close()


def encode_conversations(encoder, conversations, drops, spec, max_length, over_long,
                         workers=1):
    """Encodes each conversation (in `workers` processes); one that cannot be
    used goes into `drops` with its reason (never the end of the run).
    Returns Encodings, the same for any number of workers."""
    result = Encodings()
    for conversation, (encoded, reason, why) in zip(
            conversations, _encodings(encoder, conversations, workers)):
        if encoded is None:
            drops.add(reason, conversation.where, why)
            continue
        ids, mask = encoded.ids, encoded.mask
        if len(ids) > max_length:
            if over_long == "drop":
                drops.add("over-long", conversation.where,
                          f"{len(ids)} tokens, more than --max-length {max_length}")
                continue
            ids, mask = ids[:max_length], mask[:max_length]
            result.truncated += 1
        if not packing.has_anchor_candidate(mask):
            drops.add("too-few-supervised", conversation.where,
                      f"{int(mask.sum())} supervised token(s), no two consecutive"
                      + (" after truncation" if len(encoded.ids) > len(ids) else ""))
            continue
        outside = ids >= spec.vocab_size
        if outside.any():
            raise UserError(f"{conversation.where}: encodes to token "
                            f"{int(ids[outside][0])}, outside {spec.path} "
                            f"[target] vocab_size {spec.vocab_size}")
        hits = int((ids == spec.mask_token_id).sum())
        if hits:
            result.mask_hits += hits
            result.first_hit = result.first_hit or conversation.where
        found = encoded.spans
        result.methods[found.method] += 1
        result.turns.update(present=found.turns, supervised=found.supervised,
                            without_end=found.without_end)
        result.sequences.append((ids, mask))
    return result


def run(args):
    chat.check_inputs(args.inputs)
    spec = load_spec(args.spec)
    seq_len = args.seq_len or spec.seq_len
    if seq_len < 2:
        raise UserError(f"--seq-len {seq_len}: rows need at least 2 tokens")
    if seq_len != spec.seq_len:
        warn(f"--seq-len {seq_len} differs from {spec.path} [training] seq_len "
             f"{spec.seq_len}: the trainer of this spec refuses these shards")
    max_length = args.max_length or seq_len
    if not 2 <= max_length <= seq_len:
        raise UserError(f"--max-length {max_length} must be in [2, {seq_len}] "
                        "(the row length)")
    if args.rows_per_shard < 1:
        raise UserError("--rows-per-shard must be at least 1")
    for path in args.inputs:
        if os.path.isdir(path):
            raise UserError(f"{path}: a directory, not a chat JSONL file")
        if not os.path.isfile(path):
            raise UserError(f"{path}: no such file")
    tokenizer_dir = os.path.abspath(args.tokenizer)
    if os.path.exists(tokenizer_dir) and not os.path.isdir(tokenizer_dir):
        raise UserError(f"{args.tokenizer}: not a directory (--tokenizer is a Hugging Face "
                        "tokenizer directory)")
    if not os.path.isdir(tokenizer_dir):
        raise UserError(f"{args.tokenizer}: tokenizer directory does not exist")

    options = {
        "seq_len": seq_len, "max_length": max_length, "over_long": args.over_long,
        "last_turn_only": args.last_turn_only, "reasoning": args.reasoning,
        "supervise_prefill": args.supervise_prefill, "end_of_turn": args.end_of_turn,
        "pack": args.pack, "seed": args.seed, "rows_per_shard": args.rows_per_shard,
    }
    identity = {
        "inputs": [progress.file_identity(p) for p in args.inputs],
        "options": options,
        "tokenizer": _tokenizer_identity(tokenizer_dir),
        "spec": spec.shard_metadata() | {"vocab_size": spec.vocab_size,
                                         "mask_token_id": spec.mask_token_id},
    }
    with output_lock.DirectoryLock(args.out, "tokens"):
        return _run_locked(args, spec, seq_len, max_length, tokenizer_dir, identity)


def _run_locked(args, spec, seq_len, max_length, tokenizer_dir, identity):
    """The run once it holds --out's lock: no other run writes there."""
    manifest = progress.Manifest(args.out, "tokens", progress.fingerprint(identity),
                                 args.overwrite)
    if manifest.complete:
        note(f"{args.out}: already complete ({len(manifest.shards)} shards); "
             "nothing to do")
        print(f"tokens: {args.out}: complete, {len(manifest.shards)} shards")
        return 0
    # The first five bad lines of each reason are named as they are found.
    drops = chat.Drops(name_first=5)
    with progress.stopping_cleanly(manifest):
        try:
            return _write_tokens(args, spec, seq_len, max_length, tokenizer_dir,
                                 manifest, drops)
        finally:
            drops.summarise()  # each reason's count, also where the run stops early


def _write_tokens(args, spec, seq_len, max_length, tokenizer_dir, manifest, drops):
    """The run once its output directory is open: read, encode, pack, write."""
    # The data first: its problems are reported before the slow loads.
    conversations = list(chat.read_conversations(args.inputs, drops, args.reasoning))
    lines_read = len(conversations) + drops.total()
    drops.summarise()
    note(f"read {len(args.inputs)} file(s): {lines_read} conversation line(s), "
         f"{len(conversations)} usable so far")
    if not conversations:  # said before the tokenizer's slow load
        named = ", ".join(args.inputs) if len(args.inputs) <= 3 else \
            f"the {len(args.inputs)} input files"
        raise UserError(f"no usable conversation in {named} ({lines_read} line(s), "
                        f"{drops.total()} dropped)")

    tokenizer = template.load_tokenizer(tokenizer_dir)
    chat_template = template.chat_template_of(tokenizer, tokenizer_dir)
    end_of_turn = tuple(args.end_of_turn or template.end_of_turn_tokens(tokenizer_dir))
    if not end_of_turn:
        warn(f"{tokenizer_dir}: no end-of-turn token found (no eos token, nor a usual "
             "one among its added tokens): turns are supervised without one; name it "
             "with --end-of-turn")
    encoder = template.ChatEncoder(
        tokenizer, template.TokenizerRenderer(tokenizer, chat_template),
        spans.SpanSettings(end_of_turn, args.last_turn_only, args.supervise_prefill))
    for line in template.check_mask_token(tokenizer, spec, tokenizer_dir):
        note(line)
    note("loss masks from the one full render of each conversation"
         + (" (the template's generation markers)"
            if template.has_generation_markers(chat_template) else "")
         + "; end of turn: " + ", ".join(end_of_turn or ("none",)))

    encoded = encode_conversations(encoder, conversations, drops, spec, max_length,
                                   args.over_long, args.workers)
    sequences, truncated, methods, turns = (encoded.sequences, encoded.truncated,
                                            encoded.methods, encoded.turns)
    drops.summarise()
    if encoded.mask_hits:
        raise UserError(f"{spec.path}: [drafter] mask_token_id {spec.mask_token_id} "
                        f"is produced by the tokenizer on the data ({encoded.mask_hits} "
                        f"times, first in {encoded.first_hit}); the drafter could not tell it from "
                        "a masked slot: pick a token the tokenizer never produces")
    if not sequences:
        raise UserError(f"no conversation left to write ({drops.total()} dropped)")

    pad_id = tokenizer.pad_token_id
    if pad_id is None:
        pad_id = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else 0
    rows = packing.build_rows(sequences, seq_len, int(pad_id), args.pack, args.seed)

    settings = {
        "packed": "true" if args.pack else "false",
        "pad_token_id": int(pad_id),
        "tokenizer": tokenizer_dir,
        "tokenizer_name": getattr(tokenizer, "name_or_path", "") or tokenizer_dir,
        "tokenizer_vocab_size": len(tokenizer),
        "chat_template": chat_template,
        "chat_template_sha256": template.template_sha256(chat_template),
        "loss_mask_from": json.dumps(dict(sorted(methods.items()))),
        "end_of_turn": json.dumps(list(end_of_turn), ensure_ascii=False),
        "last_turn_only": "true" if args.last_turn_only else "false",
        "supervise_prefill": "true" if args.supervise_prefill else "false",
        "reasoning": args.reasoning,
        "max_length": max_length,
        "over_long": args.over_long,
    }
    meta = token_shard_metadata(spec, settings)
    written = 0
    count = (len(rows) + args.rows_per_shard - 1) // args.rows_per_shard
    manifest.planned = count
    for index in range(count):
        name = shards.shard_name(index)
        begin = index * args.rows_per_shard
        end = min(len(rows), begin + args.rows_per_shard)
        if manifest.done(name):
            continue
        tensors = {
            "input_ids": shards.Tensor("I32", rows.input_ids[begin:end]),
            "loss_mask": shards.Tensor("U8", rows.loss_mask[begin:end]),
            "num_tokens": shards.Tensor("I32", rows.num_tokens[begin:end]),
        }
        if args.pack:
            tensors["position_ids"] = shards.Tensor("I32", rows.position_ids[begin:end])
        size = shards.write_shard(os.path.join(args.out, name), tensors,
                                  dict(meta, first_row=str(begin)))
        manifest.record(name, {"rows": end - begin, "first_row": begin, "bytes": size})
        written += 1
    kept = count - written

    tokens = int(rows.num_tokens.sum())
    supervised = int(rows.loss_mask.sum())
    report = {
        "files": len(args.inputs),
        "lines": lines_read,
        "conversations": len(sequences),
        "dropped": drops.as_dict(),
        "truncated": truncated,
        "rows": len(rows),
        "shards": count,
        "tokens": tokens,
        "supervised_tokens": supervised,
        "supervised_share": supervised / float(max(tokens, 1)),
        "assistant_turns": turns["present"],
        "supervised_turns": turns["supervised"],
        "turns_without_end_of_turn": turns["without_end"],
        "spans_from": dict(sorted(methods.items())),
        "fill": tokens / float(len(rows) * seq_len),
    }
    manifest.save(complete=True, report=report)
    dropped = drops.total()
    note(f"dropped {dropped} of {lines_read}" + (": " if dropped else "") +
         ", ".join(f"{chat.REASONS[r]} {n}" for r, n in drops.as_dict().items()) +
         (f"; truncated {truncated} over-long (--over-long truncate)" if truncated else ""))
    note(f"assistant turns: {turns['present']} in the {len(sequences)} conversations "
         f"kept, {turns['supervised']} supervised"
         + (" (--last-turn-only)" if args.last_turn_only else "")
         + (f", {turns['without_end']} of them without an end-of-turn token after them"
            if turns["without_end"] else "")
         + "; spans from " + ", ".join(f"{m} {n}" for m, n in sorted(methods.items())))
    note(f"wrote {written} shard(s)" + (f", kept {kept} complete from an earlier run" if kept else "")
         + f": {len(rows)} rows of {seq_len} tokens, {len(sequences)} conversations"
         + (" packed" if args.pack else ", one per row")
         + f", {tokens} tokens ({100.0 * report['fill']:.1f}% of the row slots), "
           f"{supervised} supervised ({100.0 * report['supervised_share']:.1f}%)")
    print(f"tokens: {args.out}: {len(rows)} rows in {count} shards, "
          f"{len(sequences)} conversations, {dropped} dropped")
    sys.stdout.flush()
    return 0
