"""`dflash-prepare regenerate`: the assistant turns of chat data replaced by
the target's own answers, so that a drafter learns what the target says
(docs/data.md, "Regenerated answers").

Each conversation is one job. Its assistant turns are answered in order,
each from the conversation before it with the earlier turns already
replaced, so a later turn answers the target's own earlier answers. A turn
with tool calls is kept as it is when tool results follow it (they answer
those calls); with `--last-turn-only` only the last assistant turn is
answered and everything before it is kept.

Output: one OpenAI-form line per conversation, appended and flushed as each
one completes (completion order, not input order), with "source"
("FILE:LINE") naming its input line. A rerun with the same inputs and
options skips the sources already written; a line cut short by a kill is
dropped and redone. A conversation whose request fails (after the retries)
or whose answer is malformed is counted, named and left out; the run goes
on, and a rerun tries it again.
"""
import concurrent.futures
import json
import os
import sys
import threading
import time

from . import chat
from .errors import UserError, note, warn
from .progress import file_identity, fingerprint
from .regenerate_backends import (Answer, RequestFailed, ServerBackend,  # noqa: F401
                                  TransformersBackend)

STATE_SUFFIX = ".state.json"


class Job:
    """One input conversation: its messages, tools and `FILE:LINE`."""

    def __init__(self, conversation, source):
        self.messages = conversation.messages
        self.tools = conversation.tools
        self.source = source


def turns_to_answer(messages, last_turn_only):
    """Indices of the assistant turns to replace."""
    turns = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    if last_turn_only:
        return turns[-1:]
    answered = []
    for i in turns:
        followed_by_tool = i + 1 < len(messages) and messages[i + 1]["role"] == "tool"
        if messages[i].get("tool_calls") and followed_by_tool:
            continue  # its tool results answer these calls: keep them
        answered.append(i)
    return answered


def answer_message(answer):
    message = {"role": "assistant", "content": answer.content}
    if answer.reasoning:
        message["reasoning_content"] = answer.reasoning
    if answer.tool_calls:
        message["tool_calls"] = answer.tool_calls
    return message


def regenerate_conversation(job, backend, last_turn_only):
    """The conversation with its turns answered by `backend`, and the
    answers' (completion tokens, truncated count)."""
    messages = [dict(m) for m in job.messages]
    tokens = truncated = differs = 0
    for index in turns_to_answer(messages, last_turn_only):
        answer = backend.complete(messages[:index], job.tools)
        messages[index] = answer_message(answer)
        tokens += answer.completion_tokens
        truncated += answer.truncated
        differs += answer.retokenized_differs
    record = {"messages": messages, "source": job.source}
    if job.tools:
        record["tools"] = job.tools
    return record, tokens, truncated, differs


def completed_sources(path):
    """The sources already in `path`; a last line without its newline (a
    kill mid-write) is cut off so that it is redone."""
    done = set()
    if not os.path.exists(path):
        return done
    with open(path, "rb") as f:
        data = f.read()
    end = data.rfind(b"\n") + 1
    if end < len(data):
        with open(path, "r+b") as f:
            f.truncate(end)
        note(f"{path}: dropped a line cut short by an interrupted run")
    for number, raw in enumerate(data[:end].splitlines(), 1):
        try:
            source = json.loads(raw)["source"]
        except (ValueError, KeyError, TypeError):
            raise UserError(f"{path}:{number}: not a line of dflash-prepare regenerate "
                            "(no \"source\"); use another --out") from None
        done.add(source)
    return done


def open_state(args, identity):
    """Checks `--out`'s state file against this run; returns its path."""
    state = args.out + STATE_SUFFIX
    mark = fingerprint(identity)
    if os.path.exists(state):
        try:
            with open(state) as f:
                old = json.load(f)
        except (OSError, ValueError):
            raise UserError(f"{state}: unreadable; remove it and {args.out} to start "
                            "over") from None
        if old.get("fingerprint") != mark:
            if not args.overwrite:
                raise UserError(f"{args.out}: written by a run with other inputs or "
                                "options (see its .state.json); use another --out, or "
                                "--overwrite to start over")
            os.remove(args.out)
            note(f"{args.out}: removed the output of an earlier run (--overwrite)")
    elif os.path.exists(args.out) and os.path.getsize(args.out) > 0:
        if not args.overwrite:
            raise UserError(f"{args.out}: exists and was not written by regenerate "
                            "(no .state.json); use another --out, or --overwrite")
        os.remove(args.out)
    with open(state, "w") as f:
        json.dump({"fingerprint": mark, "run": identity}, f, indent=1)
    return state


class Meter:
    """Counts and a progress line on stderr (at most twice a second)."""

    def __init__(self, total, done):
        self.total, self.done = total, done
        self.written = self.failed = self.tokens = self.truncated = self.differs = 0
        self.began = time.monotonic()
        self.shown = 0.0
        self.lock = threading.Lock()

    def line(self):
        seconds = max(time.monotonic() - self.began, 1e-9)
        count = self.done + self.written + self.failed
        width = 24
        filled = int(width * count / self.total) if self.total else width
        return (f"\r[{'#' * filled}{'.' * (width - filled)}] {count}/{self.total} "
                f"conversations, {self.failed} failed, {self.tokens / seconds:.0f} tokens/s")

    def show(self, force=False):
        now = time.monotonic()
        if force or now - self.shown >= 0.5:
            self.shown = now
            print(self.line(), end="\n" if force else "", file=sys.stderr, flush=True)


def make_backend(args):
    options = dict(temperature=args.temperature, top_p=args.top_p,
                   max_tokens=args.max_tokens, template_options=args.template_options)
    if args.backend == "server":
        if not args.server or not args.model:
            raise UserError("--backend server needs --server URL and --model NAME")
        return ServerBackend(args.server, args.model, timeout=args.timeout,
                             retries=args.retries, backoff=args.retry_backoff, **options)
    if not args.target:
        raise UserError("--backend transformers needs --target DIR")
    return TransformersBackend(args.target, device=args.device, dtype=args.dtype,
                               batch=args.concurrency, **options)


def run(args):
    if args.backend is None:
        args.backend = "server" if args.server else "transformers"
    # The data first, its bad lines named as in tokens, before the backend
    # loads a model and before anything is written.
    chat.check_inputs(args.inputs, args.out)
    drops = chat.Drops(name_first=5)
    try:
        jobs = [Job(c, c.where) for c in chat.read_conversations(args.inputs, drops)]
    finally:
        drops.summarise()
    if not jobs:
        raise UserError(f"no usable conversation in {', '.join(args.inputs)} "
                        f"({drops.total()} line(s) unusable)")
    backend = make_backend(args)
    identity = {"inputs": [file_identity(p) for p in args.inputs],
                "input_names": list(args.inputs),
                "backend": args.backend, "server": args.server, "model": args.model,
                "target": os.path.abspath(args.target) if args.target else None,
                "dtype": args.dtype if args.backend == "transformers" else None,
                "temperature": args.temperature, "top_p": args.top_p,
                "max_tokens": args.max_tokens, "template_options": args.template_options,
                "last_turn_only": args.last_turn_only}
    state = open_state(args, identity)
    done = completed_sources(args.out)
    pending = [j for j in jobs if j.source not in done]
    note(f"{len(jobs)} conversations: {len(jobs) - len(pending)} already in {args.out}, "
         f"{len(pending)} to regenerate with the {args.backend} backend "
         f"({args.concurrency} in flight)")
    meter = Meter(len(jobs), len(jobs) - len(pending))
    failures = []
    with open(args.out, "a", encoding="utf-8") as out, \
            concurrent.futures.ThreadPoolExecutor(args.concurrency) as pool:
        futures = {pool.submit(regenerate_conversation, j, backend, args.last_turn_only): j
                   for j in pending}
        try:
            for future in concurrent.futures.as_completed(futures):
                job = futures[future]
                try:
                    record, tokens, truncated, differs = future.result()
                except RequestFailed as failure:
                    meter.failed += 1
                    failures.append({"source": job.source, "why": str(failure)})
                    print("", file=sys.stderr)
                    warn(f"{job.source}: {failure}; left out (a rerun tries it again)")
                    continue
                out.write(json.dumps(record, ensure_ascii=False) + "\n")
                out.flush()
                meter.written += 1
                meter.tokens += tokens
                meter.truncated += truncated
                meter.differs += differs
                meter.show()
        except BaseException:
            for future in futures:
                future.cancel()
            backend.close()
            raise
    backend.close()
    meter.show(force=True)
    seconds = time.monotonic() - meter.began
    report = {"conversations": len(jobs), "regenerated": meter.written,
              "already_done": len(jobs) - len(pending), "failed": meter.failed,
              "failures": failures[:100], "unusable_lines": drops.total(),
              "completion_tokens": meter.tokens, "truncated_answers": meter.truncated,
              "retokenized_differs": meter.differs if args.backend == "transformers" else None,
              "seconds": round(seconds, 2),
              "tokens_per_s": round(meter.tokens / seconds, 1) if seconds > 0 else None}
    with open(state, "w") as f:
        json.dump({"fingerprint": fingerprint(identity), "run": identity,
                   "report": report}, f, indent=1)
    if meter.truncated:
        warn(f"{meter.truncated} answer(s) stopped at --max-tokens {args.max_tokens}")
    print(f"regenerate: {args.out}: {meter.written} regenerated, "
          f"{report['already_done']} already there, {meter.failed} failed; "
          f"{meter.tokens} tokens at {report['tokens_per_s']} tokens/s")
    # Failures are named above and left out; only a run that got nothing fails.
    return 1 if pending and meter.failed == len(pending) else 0
