"""`dflash-prepare regenerate`: the assistant turns of chat data replaced by
the target's own answers, so that a drafter learns what the target says
(docs/data.md, "Regenerated answers").

Each conversation is one job. Its assistant turns are answered in order,
each from the conversation before it with the earlier turns already
replaced, so a later turn answers the target's own earlier answers. A turn
with tool calls is kept as it is when tool results follow it (they answer
those calls); with `--last-turn-only` only the last assistant turn is
answered and everything before it is kept.

Output: one OpenAI-form line per conversation, appended as each one
completes (completion order, not input order), with "source" ("FILE:LINE")
naming its input line. One run at a time writes an output (a lock beside
it, output_lock). A rerun whose data and answer-making options match (the
inputs by content, the model, template options, sampling, max tokens; not
the server's address) skips the sources already written; a line cut short
by a kill is dropped and redone. Any problem with an answer (a request that
fails after the retries, a malformed, non-UTF-8 or empty answer) is that
conversation's failure: counted, named and left out; the run goes on, and
a rerun tries it again. SIGINT or SIGTERM stops the run within seconds,
keeping what is written and writing the report.
"""
import collections
import json
import os
import queue
import signal
import sys
import threading
import time

from . import chat, output_lock
from .errors import UserError, note, warn
from .progress import file_identity, file_sha256, fingerprint
from .regenerate_backends import (Answer, RequestFailed, ServerBackend,  # noqa: F401
                                  ServerUnusable, Stopped, TransformersBackend)
from .shards import write_json_atomically

STATE_SUFFIX = ".state.json"
LOCK_SUFFIX = ".lock"
# The failures the report lists by name (all are counted).
LISTED_FAILURES = 100
# How long a stop waits for the requests in flight to end.
STOP_GRACE = 5.0


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


def is_empty(answer):
    return not (answer.content or "").strip() and not answer.tool_calls


def regenerate_conversation(job, backend, last_turn_only, keep_empty=False):
    """The conversation with its turns answered by `backend`, and the
    answers' (completion tokens, truncated count)."""
    messages = [dict(m) for m in job.messages]
    tokens = truncated = differs = 0
    for index in turns_to_answer(messages, last_turn_only):
        answer = backend.complete(messages[:index], job.tools)
        if is_empty(answer) and not keep_empty:
            # Nothing for a drafter to learn, and a later turn would answer
            # an empty turn: left out (and asked again by a rerun).
            raise RequestFailed("an empty answer (no content, no tool calls); "
                                "--keep-empty-answers keeps such answers", "empty")
        messages[index] = answer_message(answer)
        tokens += answer.completion_tokens
        truncated += answer.truncated
        differs += answer.retokenized_differs
    record = {"messages": messages, "source": job.source}
    if job.tools:
        record["tools"] = job.tools
    return record, tokens, truncated, differs



def _rename_source(source, renames):
    name, _, line = source.rpartition(":")
    return f"{renames[name]}:{line}" if name in renames else source


def has_lines(path):
    """Whether `path` holds a finished line (one ending in a newline)."""
    try:
        with open(path, "rb") as f:
            while True:
                chunk = f.read(1 << 20)
                if not chunk:
                    return False
                if b"\n" in chunk:
                    return True
    except FileNotFoundError:
        return False
    except OSError as error:
        raise UserError(f"{path}: cannot read: {error.strerror}") from None


def completed_sources(path, renames=None):
    """The sources already in `path` (their input names as this run names
    them, by `renames`); a last line without its newline (a kill or a full
    disk mid-write) is cut off so that it is redone."""
    done = set()
    if not os.path.exists(path):
        return done
    try:
        with open(path, "rb") as f:
            data = f.read()
        end = data.rfind(b"\n") + 1
        if end < len(data):
            with open(path, "r+b") as f:
                f.truncate(end)
            note(f"{path}: dropped a line cut short by an interrupted run")
    except OSError as error:
        raise UserError(f"{path}: cannot read or cut its unfinished line: "
                        f"{error.strerror}") from None
    for number, raw in enumerate(data[:end].splitlines(), 1):
        try:
            source = json.loads(raw)["source"]
        except (ValueError, KeyError, TypeError, RecursionError):
            raise UserError(f"{path}:{number}: not a line of dflash-prepare regenerate "
                            "(no \"source\"); use another --out") from None
        done.add(_rename_source(source, renames or {}))
    return done


# What a resume binds, as the options that set it (named in a refusal).
BOUND = {"inputs": "inputs (by content)", "backend": "--backend", "model": "--model",
         "target": "--target", "dtype": "--dtype", "temperature": "--temperature",
         "top_p": "--top-p", "max_tokens": "--max-tokens",
         "template_options": "--template-option", "last_turn_only": "--last-turn-only"}


def save_state(path, value):
    try:
        write_json_atomically(path, value)
    except OSError as error:
        raise UserError(f"{path}: cannot write: {error.strerror}") from None


def open_state(args, identity):
    """Checks `--out`'s state file against this run and records this run in
    it; returns (its path, {earlier input name: this run's}). What binds a
    resume is `identity` (the data and what makes the answers); a state
    whose run wrote no answer binds nothing."""
    state = args.out + STATE_SUFFIX
    mark = fingerprint(identity)
    written = has_lines(args.out)
    old = None
    if os.path.exists(state):
        try:
            with open(state) as f:
                old = json.load(f)
            if not isinstance(old, dict):
                raise ValueError
        except (OSError, ValueError):
            if written:
                raise UserError(f"{state}: unreadable; remove it and {args.out} to start "
                                "over") from None
            old = {}
    renames = {}
    same = old is not None and (old.get("fingerprint") == mark or
                                _same_first_version_run(old, args, identity))
    if same:
        # The names the output's sources use (the first version kept them in "run").
        run = old.get("run") if isinstance(old.get("run"), dict) else {}
        before = old.get("input_names") or run.get("input_names") or []
        renames = {a: b for a, b in zip(before, args.inputs) if a != b}
        if renames:
            note(f"{args.out}: its inputs are named otherwise than before (the same "
                 "content): continuing; its earlier lines keep their earlier names")
    elif old is not None and not written:
        if old:
            note(f"{args.out}: the earlier run wrote no answer, so its options bind "
                 "nothing: starting with these")
        _remove(args.out)
    elif old is not None:
        if not args.overwrite:
            run = old.get("run") if isinstance(old.get("run"), dict) else {}
            differ = [BOUND[k] for k in BOUND if run.get(k) != identity.get(k)]
            raise UserError(f"{args.out}: written by a run with other "
                            f"{', '.join(differ) or 'inputs or options'} (see its "
                            ".state.json); use another --out, or --overwrite to start over")
        _remove(args.out)
        note(f"{args.out}: removed the output of an earlier run (--overwrite)")
    elif os.path.exists(args.out) and os.path.getsize(args.out) > 0:
        if written and not args.overwrite:
            raise UserError(f"{args.out}: exists and was not written by regenerate "
                            "(no .state.json); use another --out, or --overwrite")
        _remove(args.out)
    save_state(state, {"fingerprint": mark, "run": identity, "input_names": args.inputs,
                       "server": args.server})
    return state, renames


def _same_first_version_run(old, args, identity):
    """Whether a state of the first version (bound to the inputs' paths,
    sizes and times, and the server) names this run: a run in progress
    across the upgrade continues."""
    run = (old or {}).get("run")
    if not isinstance(run, dict) or "version" in run:
        return False
    try:
        inputs = [file_identity(p) for p in args.inputs]
    except OSError:
        return False
    return run.get("inputs") == inputs and all(
        run.get(k) == identity[k] for k in BOUND if k != "inputs")


def _remove(path):
    try:
        os.remove(path)
    except FileNotFoundError:
        pass
    except OSError as error:
        raise UserError(f"{path}: cannot remove: {error.strerror}") from None


def _write_all(fd, data):
    while data:
        data = data[os.write(fd, data):]


class Output:
    """The output file, appended a whole line at a time. A line that cannot
    be written whole (a full disk) is cut off again, so the file holds only
    whole lines, and the failure is one UserError naming the file."""

    def __init__(self, path):
        self.path = path
        try:
            self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC,
                              0o644)
            self.size = os.fstat(self.fd).st_size
        except OSError as error:
            raise UserError(f"{path}: cannot write: {error.strerror}") from None
        self.lines = 0

    def append(self, record):
        data = (json.dumps(record, ensure_ascii=False) + "\n").encode("utf-8")
        try:
            _write_all(self.fd, data)
        except OSError as error:
            try:
                os.ftruncate(self.fd, self.size)
            except OSError:
                pass  # the next run cuts the unfinished line off
            raise UserError(f"{self.path}: cannot write: {error.strerror}; the lines "
                            "written before are kept") from None
        self.size += len(data)
        self.lines += 1

    def close(self):
        try:
            os.fsync(self.fd)
        except OSError:
            pass  # written to the page cache: kept unless the machine fails
        os.close(self.fd)


class Signals:
    """SIGINT and SIGTERM while answers are asked: the first stops the run
    (seen by the main loop; a handler only notes it, since it interrupts
    the main thread anywhere); a second ends the process at once."""

    def __init__(self):
        self.received = None
        self.previous = {}

    def _handle(self, number, frame):
        if self.received is not None:
            signal.signal(number, signal.SIG_DFL)
            os.kill(os.getpid(), number)
            return
        self.received = number

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for number in (signal.SIGINT, signal.SIGTERM):
                self.previous[number] = signal.signal(number, self._handle)
        return self

    def __exit__(self, *exc):
        for number, handler in self.previous.items():
            signal.signal(number, handler)


class Meter:
    """Counts and a progress line on stderr (at most twice a second)."""

    def __init__(self, total, done):
        self.total, self.done = total, done
        self.written = self.failed = self.tokens = self.truncated = self.differs = 0
        self.began = time.monotonic()
        self.shown = 0.0

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


def check_out(out):
    """A missing or read-only --out directory, as one line before anything."""
    folder = os.path.dirname(os.path.abspath(out))
    if not os.path.isdir(folder):
        raise UserError(f"--out {out}: the directory {folder} does not exist")
    if os.path.isdir(out):
        raise UserError(f"--out {out}: is a directory; give a file name")
    if not os.access(folder, os.W_OK):
        raise UserError(f"--out {out}: cannot write in {folder} (read-only, or not yours)")


def run(args):
    if args.backend is None:
        args.backend = "server" if args.server else "transformers"
    chat.check_inputs(args.inputs, args.out)
    check_out(args.out)
    with output_lock.OutputLock(args.out + LOCK_SUFFIX, "regenerate"):
        return _run_locked(args)


class Outcome:
    """What became of the conversations asked."""

    def __init__(self):
        self.failures = []  # {"source", "why"}
        self.kinds = collections.Counter()
        self.stopped = None  # why the run stopped early: a signal's name, or an error
        self.fatal = None  # the error that stopped it, if one did


def _run_locked(args):
    # The data first, its bad lines named as in tokens, before the backend
    # loads a model and before anything is written.
    drops = chat.Drops(name_first=5)
    try:
        jobs = [Job(c, c.where) for c in chat.read_conversations(args.inputs, drops)]
    finally:
        drops.summarise()
    if not jobs:
        raise UserError(f"no usable conversation in {', '.join(args.inputs)} "
                        f"({drops.total()} line(s) unusable)")
    try:
        contents = [file_sha256(p) for p in args.inputs]
    except OSError as error:
        raise UserError(f"{error.filename}: cannot read: {error.strerror}") from None
    backend = make_backend(args)
    backend.probe()
    # What binds a resume: the data and what makes the answers, not where
    # the server listens (another port or host name continues the run).
    identity = {"version": 2, "inputs": contents, "backend": args.backend,
                "model": args.model if args.backend == "server" else None,
                "target": os.path.abspath(args.target) if args.backend != "server" else None,
                "dtype": args.dtype if args.backend == "transformers" else None,
                "temperature": args.temperature, "top_p": args.top_p,
                "max_tokens": args.max_tokens, "template_options": args.template_options,
                "last_turn_only": args.last_turn_only}
    state, renames = open_state(args, identity)
    done = completed_sources(args.out, renames)
    pending = [j for j in jobs if j.source not in done]
    note(f"{len(jobs)} conversations: {len(jobs) - len(pending)} already in {args.out}, "
         f"{len(pending)} to regenerate with the {args.backend} backend "
         f"({args.concurrency} in flight)")
    meter = Meter(len(jobs), len(jobs) - len(pending))
    outcome = Outcome()
    output = Output(args.out)
    try:
        with Signals() as signals:
            _ask(pending, backend, args, output, meter, outcome, signals)
        if signals.received and outcome.stopped is None:  # came as the last line did
            outcome.stopped = signal.Signals(signals.received).name
    finally:
        output.close()
        backend.close()
    meter.show(force=True)
    seconds = time.monotonic() - meter.began
    failed = len(outcome.failures)
    report = {"conversations": len(jobs), "regenerated": meter.written,
              "already_done": len(jobs) - len(pending), "failed": failed,
              "not_finished": len(pending) - meter.written - failed,
              "failure_kinds": dict(outcome.kinds), "empty_answers": outcome.kinds["empty"],
              "failures": outcome.failures[:LISTED_FAILURES],
              "failures_not_listed": max(0, failed - LISTED_FAILURES),
              "unusable_lines": drops.total(), "stopped": outcome.stopped,
              "completion_tokens": meter.tokens, "truncated_answers": meter.truncated,
              "retokenized_differs": meter.differs if args.backend == "transformers" else None,
              "seconds": round(seconds, 2),
              "tokens_per_s": round(meter.tokens / seconds, 1) if seconds > 0 else None}
    try:
        save_state(state, {"fingerprint": fingerprint(identity), "run": identity,
                           "input_names": args.inputs, "server": args.server,
                           "report": report})
    except UserError as error:
        warn(f"{error}; the report is not saved")
    if meter.truncated:
        warn(f"{meter.truncated} answer(s) stopped at --max-tokens {args.max_tokens}")
    if outcome.kinds["empty"]:
        warn(f"{outcome.kinds['empty']} empty answer(s) left out (--keep-empty-answers "
             "keeps them)")
    print(f"regenerate: {args.out}: {meter.written} regenerated, "
          f"{report['already_done']} already there, {failed} failed"
          + (f", {report['not_finished']} not finished ({outcome.stopped})"
             if outcome.stopped else "")
          + f"; {meter.tokens} tokens at {report['tokens_per_s']} tokens/s")
    if outcome.fatal:
        raise UserError(f"{outcome.fatal}; stopped (what is written is kept: the same "
                        "command continues)")
    if signals.received:
        note(f"stopped by {outcome.stopped}; the same command continues (exit status "
             f"{128 + signals.received})")
        return 128 + signals.received
    # Failures are named above and left out; only a run that got nothing fails.
    return 1 if pending and failed == len(pending) else 0


def _ask(pending, backend, args, output, meter, outcome, signals):
    """Asks for `pending` on `args.concurrency` threads and writes each
    answered conversation as it comes (from this thread alone)."""
    todo = queue.Queue()
    for job in pending:
        todo.put(job)
    results = queue.Queue()
    # Set by the worker that finds the server unusable, before its result
    # reaches this thread: no worker then takes another conversation, so such
    # a server gets at most one request a worker, however late this thread
    # drains the queue.
    unusable = threading.Event()

    def work():
        while not unusable.is_set():
            try:
                job = todo.get_nowait()
            except queue.Empty:
                return
            try:
                result = regenerate_conversation(job, backend, args.last_turn_only,
                                                 args.keep_empty_answers)
            except ServerUnusable as error:
                unusable.set()
                result = error
            except (RequestFailed, Stopped) as error:
                result = error
            except Exception as error:  # a bug: that conversation's, not a hung run
                result = RequestFailed(f"internal error ({type(error).__name__}: {error})",
                                       "internal")
            results.put((job, result))

    # Daemon threads: a request that a stop cannot end in time (a connect
    # to a host that does not answer) does not keep the process alive.
    workers = [threading.Thread(target=work, daemon=True)
               for _ in range(min(args.concurrency, len(pending)))]
    for worker in workers:
        worker.start()
    expected, received, deadline = len(pending), 0, None

    def stop(why, fatal=None):
        nonlocal expected, deadline
        if outcome.stopped is None:
            outcome.stopped, outcome.fatal = why, fatal
        if deadline is not None:
            return
        deadline = time.monotonic() + STOP_GRACE
        while True:  # no new requests
            try:
                todo.get_nowait()
            except queue.Empty:
                break
            expected -= 1
        backend.stop()  # those in flight end now, their later turns unasked

    while received < expected:
        if signals.received and deadline is None:
            print("", file=sys.stderr)
            note(f"{signal.Signals(signals.received).name}: stopping (no new requests, "
                 "those in flight ended; a second signal ends it at once)")
            stop(signal.Signals(signals.received).name)
        if deadline is not None and time.monotonic() > deadline:
            break
        try:
            job, result = results.get(timeout=0.1)
        except queue.Empty:
            continue
        received += 1
        if isinstance(result, Stopped):
            continue
        if isinstance(result, ServerUnusable):
            stop("the server is unusable", str(result))
            continue
        if isinstance(result, RequestFailed):
            meter.failed += 1
            outcome.kinds[result.kind] += 1
            outcome.failures.append({"source": job.source, "why": str(result)})
            print("", file=sys.stderr)
            warn(f"{job.source}: {result}; left out (a rerun tries it again)")
            continue
        if outcome.stopped == "the output cannot be written":
            continue  # the output cannot be written: the rerun asks again
        record, tokens, truncated, differs = result
        try:
            output.append(record)
        except UserError as error:
            stop("the output cannot be written", str(error))
            continue
        meter.written += 1
        meter.tokens += tokens
        meter.truncated += truncated
        meter.differs += differs
        meter.show()
