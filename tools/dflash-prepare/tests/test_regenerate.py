"""dflash-prepare regenerate against a stand-in OpenAI-compatible server: a
real HTTP server on 127.0.0.1 (http.server), started by each test. The
servers meant are vLLM and SGLang; this one answers from the request alone
and misbehaves on cue: the last user message names what it does (slow,
fail500, drop, malformed, surrogate, deep, always500, bad400, delay,
trickle, busy429, busydate, busylong, empty, badutf8, hang, vanish, moved). It
serves one model (404 for another) and lists it at GET /v1/models unless
told not to."""
import email.utils
import errno
import http.server
import io
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import unittest
from contextlib import redirect_stderr, redirect_stdout
from unittest import mock

import helpers  # noqa: F401  (imports the checkout's dflash_prepare)
from helpers import PREPARE, TempDir

from dflash_prepare import chat, cli, regenerate, regenerate_backends


class StandInServer:
    """Counts attempts per conversation (and when each came), in-flight
    requests and their peak."""

    def __init__(self, client_timeout, model="stand-in", list_models=True):
        self.client_timeout = client_timeout
        self.model = model
        self.list_models = list_models
        self.lock = threading.Lock()
        self.attempts = {}
        self.times = {}  # user message -> [arrival times]
        self.requests = []
        self.gets = []
        self.in_flight = 0
        self.peak = 0
        self.closing = threading.Event()
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                server.gets.append(self.path)
                if server.list_models and self.path == "/v1/models":
                    data = {"object": "list", "data": [{"id": server.model}]}
                    return server.send(self, 200, json.dumps(data).encode())
                server.send(self, 404, b'{"detail": "Not Found"}')

            def do_POST(self):
                try:
                    body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                except (ValueError, ConnectionResetError):
                    return  # the client stopped while sending (a stop, a full disk)
                try:
                    server.answer(self, body)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up on it (a timeout, a stop)

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.closing.set()
        self.httpd.shutdown()
        self.httpd.server_close()

    def answer(self, handler, body):
        user = [m["content"] for m in body["messages"] if m["role"] == "user"][-1]
        key = json.dumps(body["messages"])
        with self.lock:
            attempt = self.attempts[key] = self.attempts.get(key, 0) + 1
            self.times.setdefault(user, []).append(time.monotonic())
            self.requests.append(body)
        if body["model"] != self.model:  # vLLM's answer
            return self.send(handler, 404, json.dumps({
                "object": "error", "message": f"The model `{body['model']}` does not exist.",
                "type": "NotFoundError", "code": 404}).encode())
        if "hang" in user:  # no answer while the test runs
            self.closing.wait(30)
            return
        if "vanish" in user:  # the server goes away: later connections are refused
            threading.Thread(target=self.close, daemon=True).start()
            handler.close_connection = True
            return
        if "moved" in user:
            return self.send(handler, 307, b"", {"Location": "http://elsewhere/v1"})
        if "slow" in user and attempt == 1:
            time.sleep(self.client_timeout * 3)
        if "delay" in user:
            # Counted around the work alone: a thread that has sent its answer
            # but not yet returned would overlap the client's next request.
            with self.lock:
                self.in_flight += 1
                self.peak = max(self.peak, self.in_flight)
            time.sleep(0.3)
            with self.lock:
                self.in_flight -= 1
        if ("fail500" in user and attempt == 1) or "always500" in user:
            return self.send(handler, 500, b'{"error": "internal"}')
        if "drop" in user and attempt == 1:
            handler.close_connection = True
            return  # no answer: the client sees the connection closed
        if "bad400" in user:
            return self.send(handler, 400, b'{"error": "bad request"}')
        if "malformed" in user:
            return self.send(handler, 200, b"<html>not json</html>")
        if "surrogate" in user:  # valid JSON, but no UTF-8 text
            return self.send(handler, 200, b'{"choices": [{"message": {"role": '
                             b'"assistant", "content": "x \\udc00 y"}}]}')
        if "deep" in user:  # valid JSON past python's recursion limit
            return self.send(handler, 200, b'{"choices": ' + b"[" * 200000 + b"]" * 200000
                             + b"}")
        if "badutf8" in user:  # a byte that is no UTF-8
            return self.send(handler, 200, b'{"choices": [{"message": {"role": '
                             b'"assistant", "content": "caf\xe9"}}]}')
        if attempt == 1 and ("busy429" in user or "busydate" in user or "busylong" in user):
            wait = {"busy429": "1", "busylong": "100000",
                    "busydate": email.utils.formatdate(time.time() + 2, usegmt=True)}
            word = next(w for w in wait if w in user)
            return self.send(handler, 429 if word != "busydate" else 503,
                             b'{"error": "busy"}', {"Retry-After": wait[word]})
        turn = sum(m["role"] == "assistant" for m in body["messages"])
        message = {"role": "assistant", "content": f"A{turn}: {user}",
                   "reasoning_content": f"thinking about {user}"}
        if "empty" in user:
            message = {"role": "assistant", "content": ""}
        reply = {"choices": [{"message": message, "finish_reason": "stop"}],
                 "usage": {"completion_tokens": 5}}
        payload = json.dumps(reply).encode()
        if "trickle" in user and attempt == 1:
            # A byte every 0.25 s: each read is quick, the whole answer is not.
            self.send_head(handler, 200, len(payload))
            for i in range(len(payload)):
                if self.closing.wait(0.25):
                    return
                handler.wfile.write(payload[i:i + 1])
            return
        self.send(handler, 200, payload)

    @staticmethod
    def send_head(handler, status, length, headers=None):
        handler.send_response(status)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(length))
        for name, value in (headers or {}).items():
            handler.send_header(name, value)
        handler.end_headers()

    @classmethod
    def send(cls, handler, status, payload, headers=None):
        cls.send_head(handler, status, len(payload), headers)
        handler.wfile.write(payload)


def closed_port():
    """A port on 127.0.0.1 that nothing listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def conversation(*users, system=None):
    messages = [{"role": "system", "content": system}] if system else []
    for i, text in enumerate(users):
        messages += [{"role": "user", "content": text},
                     {"role": "assistant", "content": f"original {i}"}]
    return {"messages": messages}


class RegenerateBase(TempDir):
    """A stand-in server per test, and regenerate run in this process.

    Requests get TIMEOUT seconds, far above what the stand-in takes on a
    loaded machine, so that a test counting requests sees no retry it did not
    cause; a test of timeouts passes --timeout SHORT_TIMEOUT (below the
    stand-in's delays on cue, which are StandInServer.client_timeout * 3)."""

    TIMEOUT = "10"
    SHORT_TIMEOUT = "0.5"

    def setUp(self):
        super().setUp()
        self.server = StandInServer(client_timeout=0.5)

    def tearDown(self):
        self.server.close()
        super().tearDown()

    def write_chat(self, records, name="chat.jsonl"):
        lines = [r if isinstance(r, str) else json.dumps(r) for r in records]
        return self.write_file(name, "\n".join(lines) + "\n")

    def regenerate(self, chat_path, *extra):
        args = ["regenerate", chat_path, "--out", self.path("regen.jsonl"),
                "--server", self.server.url, "--model", "stand-in", "--timeout", self.TIMEOUT,
                "--retries", "2", "--retry-backoff", "0.01", *extra]
        out, err = io.StringIO(), io.StringIO()
        with redirect_stdout(out), redirect_stderr(err):
            code = cli.main(args)
        return code, out.getvalue(), err.getvalue()

    def output(self):
        with open(self.path("regen.jsonl")) as f:
            return [json.loads(line) for line in f]


class RegenerateTest(RegenerateBase):
    def test_every_turn_answers_the_target_s_own_earlier_turns(self):
        chat_path = self.write_chat([conversation("u0", "u1", system="sys"),
                                     conversation("v0", "v1", "v2")])
        code, out, err = self.regenerate(chat_path, "--concurrency", "2")
        self.assertEqual(code, 0, err)
        lines = {line["source"]: line["messages"] for line in self.output()}
        self.assertEqual(sorted(lines), [f"{chat_path}:1", f"{chat_path}:2"])
        first = lines[f"{chat_path}:1"]
        self.assertEqual([m["role"] for m in first],
                         ["system", "user", "assistant", "user", "assistant"])
        self.assertEqual(first[2], {"role": "assistant", "content": "A0: u0",
                                    "reasoning_content": "thinking about u0"})
        self.assertEqual(first[4]["content"], "A1: u1")
        self.assertEqual([m["content"] for m in lines[f"{chat_path}:2"][1::2]],
                         ["A0: v0", "A1: v1", "A2: v2"])
        # The second turn's request held the regenerated first answer.
        asked = [r["messages"] for r in self.server.requests
                 if r["messages"][-1]["content"] == "u1"]
        self.assertEqual(asked[0][2]["content"], "A0: u0")
        self.assertIn("regenerate:", out)
        # What it writes is chat data that tokens reads.
        drops = chat.Drops()
        read = list(chat.read_conversations([self.path("regen.jsonl")], drops))
        self.assertEqual((len(read), drops.total()), (2, 0))
        # Two workers write in the order they finish; find the first conversation by its text.
        (first_read,) = [c for c in read if c.messages[1]["content"] == "u0"]
        self.assertEqual(first_read.messages[2]["reasoning_content"], "thinking about u0")

    def test_last_turn_only_keeps_the_earlier_turns(self):
        chat_path = self.write_chat([conversation("u0", "u1")])
        code, _, err = self.regenerate(chat_path, "--last-turn-only")
        self.assertEqual(code, 0, err)
        (line,) = self.output()
        self.assertEqual(line["messages"][1]["content"], "original 0")
        self.assertEqual(line["messages"][3]["content"], "A1: u1")
        self.assertEqual(len(self.server.requests), 1)

    def test_sampling_and_template_options_reach_the_server(self):
        chat_path = self.write_chat([conversation("u0")])
        code, _, err = self.regenerate(chat_path, "--temperature", "0.7", "--top-p", "0.9",
                                       "--max-tokens", "77",
                                       "--template-option", "enable_thinking=false")
        self.assertEqual(code, 0, err)
        (request,) = self.server.requests
        self.assertEqual((request["temperature"], request["top_p"], request["max_tokens"]),
                         (0.7, 0.9, 77))
        self.assertEqual(request["chat_template_kwargs"], {"enable_thinking": False})
        self.assertEqual(request["model"], "stand-in")

    def test_timeouts_500s_and_dropped_connections_are_retried(self):
        chat_path = self.write_chat([conversation("slow"), conversation("fail500"),
                                     conversation("drop"), conversation("fine")])
        code, _, err = self.regenerate(chat_path, "--concurrency", "4",
                                       "--timeout", self.SHORT_TIMEOUT)
        self.assertEqual(code, 0, err)
        self.assertEqual(sorted(m["messages"][1]["content"] for m in self.output()),
                         ["A0: drop", "A0: fail500", "A0: fine", "A0: slow"])
        attempts = {json.loads(k)[-1]["content"]: n for k, n in self.server.attempts.items()}
        self.assertEqual(attempts, {"slow": 2, "fail500": 2, "drop": 2, "fine": 1})

    def test_failed_lines_are_named_counted_and_left_out(self):
        chat_path = self.write_chat([conversation("fine0"), conversation("malformed"),
                                     conversation("always500"), conversation("bad400"),
                                     "{not json", conversation("fine1")])
        code, out, err = self.regenerate(chat_path, "--concurrency", "3")
        self.assertEqual(code, 0, err)
        self.assertEqual(sorted(m["messages"][1]["content"] for m in self.output()),
                         ["A0: fine0", "A0: fine1"])
        self.assertIn(f"{chat_path}:2: malformed answer: the body is not json", err)
        self.assertIn(f"{chat_path}:3: HTTP 500", err)
        self.assertIn("after 3 attempts", err)
        self.assertIn(f"{chat_path}:4: HTTP 400", err)
        self.assertIn(f"dropped {chat_path}:5: malformed json: ", err)
        self.assertIn("malformed json line: 1 dropped\n", err)
        attempts = {json.loads(k)[-1]["content"]: n for k, n in self.server.attempts.items()}
        self.assertEqual((attempts["always500"], attempts["bad400"], attempts["malformed"]),
                         (3, 1, 1))
        with open(self.path("regen.jsonl") + ".state.json") as f:
            report = json.load(f)["report"]
        self.assertEqual((report["regenerated"], report["failed"]), (2, 3))
        self.assertEqual(sorted(f["source"] for f in report["failures"]),
                         [f"{chat_path}:{n}" for n in (2, 3, 4)])
        self.assertIn("2 regenerated, 0 already there, 3 failed", out)

    def test_an_answer_no_utf8_output_holds_is_that_conversations_failure(self):
        # A lone surrogate escape and a body nested 200000 deep each raised out
        # of the run (UnicodeEncodeError, RecursionError) on every rerun.
        chat_path = self.write_chat([conversation("fine0"), conversation("surrogate"),
                                     conversation("deep"), conversation("fine1")])
        # The rerun tries the two again; with nothing else left to do it
        # exits 1, as a run does whose every conversation failed.
        for expected in (0, 1):
            code, out, err = self.regenerate(chat_path)
            self.assertEqual(code, expected, err)
            self.assertNotIn("Traceback", err)
            self.assertEqual(sorted(m["messages"][1]["content"] for m in self.output()),
                             ["A0: fine0", "A0: fine1"])
            self.assertIn(f"{chat_path}:2: malformed answer: a lone surrogate", err)
            self.assertIn(f"{chat_path}:3: malformed answer: the body nests deeper", err)
            with open(self.path("regen.jsonl") + ".state.json") as f:
                report = json.load(f)["report"]
            self.assertEqual(report["failed"], 2)

    def test_an_input_named_twice_or_written_over_is_refused(self):
        chat_path = self.write_chat([conversation("fine0")])
        server = ["--server", self.server.url, "--model", "stand-in"]
        for args, why in (
                ([chat_path, chat_path, "--out", self.path("regen.jsonl")],
                 f"{chat_path}: named twice as an input"),
                ([chat_path, "--out", chat_path, "--overwrite"],
                 f"{chat_path}: the output is also an input")):
            err = io.StringIO()
            with redirect_stdout(io.StringIO()), redirect_stderr(err):
                self.assertEqual(cli.main(["regenerate", *args, *server]), 2)
            self.assertIn(why, err.getvalue())
        with open(chat_path) as f:  # the input is untouched
            self.assertEqual([json.loads(line) for line in f], [conversation("fine0")])
        self.assertEqual(self.server.requests, [])

    def test_requests_are_in_flight_concurrently(self):
        chat_path = self.write_chat([conversation(f"delay{i}") for i in range(12)])
        # A timeout far above the delay: a retry would overlap its first try.
        code, _, err = self.regenerate(chat_path, "--concurrency", "4", "--timeout", "10")
        self.assertEqual(code, 0, err)
        self.assertEqual(len(self.output()), 12)
        self.assertEqual(self.server.peak, 4)

    def test_a_killed_run_resumes_where_it_stopped(self):
        count = 12
        chat_path = self.write_chat([conversation(f"delay{i}") for i in range(count)])
        out_path = self.path("regen.jsonl")
        command = [sys.executable, PREPARE, "regenerate", chat_path, "--out", out_path,
                   "--server", self.server.url, "--model", "stand-in", "--concurrency", "1"]
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if os.path.exists(out_path):
                with open(out_path) as f:
                    if f.read().count("\n") >= 4:
                        break
            time.sleep(0.02)
        process.send_signal(signal.SIGKILL)
        process.wait()
        with open(out_path) as f:
            before = f.read().count("\n")
        self.assertGreaterEqual(before, 4)
        self.assertLess(before, count)
        with open(out_path, "a") as f:  # a line cut short by the kill
            f.write('{"messages": [{"role": "user", "conte')
        asked_before = len(self.server.requests)
        code, _, err = self.regenerate(chat_path)
        self.assertEqual(code, 0, err)
        self.assertIn("dropped a line cut short", err)
        sources = [line["source"] for line in self.output()]
        self.assertEqual(sorted(sources), sorted(f"{chat_path}:{n}" for n in
                                                 range(1, count + 1)))
        self.assertEqual(len(sources), len(set(sources)))
        # Only what was not written is asked again.
        self.assertEqual(len(self.server.requests) - asked_before, count - before)

    def test_another_run_s_output_is_refused(self):
        chat_path = self.write_chat([conversation("u0")])
        self.assertEqual(self.regenerate(chat_path)[0], 0)
        code, _, err = self.regenerate(chat_path, "--temperature", "1")
        self.assertEqual(code, 2)
        self.assertIn("written by a run with other --temperature", err)
        code, _, err = self.regenerate(chat_path, "--temperature", "1", "--overwrite")
        self.assertEqual(code, 0, err)
        self.assertEqual(len(self.output()), 1)

    def test_no_usable_conversation_is_an_error(self):
        # It ran, wrote an empty output and a state file, and said it was done.
        chat_path = self.write_chat(["{not json"] * 7 + [{"messages": []}])
        code, out, err = self.regenerate(chat_path)
        self.assertEqual(code, 2)
        self.assertIn(f"dflash-prepare: error: no usable conversation in {chat_path} "
                      "(8 line(s) unusable)", err)
        # The bad lines named as in tokens: the first five of each reason, and the counts.
        for number in range(1, 6):
            self.assertIn(f"dropped {chat_path}:{number}: malformed json", err)
        self.assertNotIn(f"{chat_path}:6:", err)
        self.assertIn("malformed json line: 7 dropped (the first 5 named above)", err)
        self.assertIn(f"dropped {chat_path}:8: 0 turns, none of them the assistant's", err)
        self.assertIn("no assistant turn: 1 dropped\n", err)
        self.assertEqual(out, "")
        self.assertFalse(os.path.exists(self.path("regen.jsonl")))
        self.assertFalse(os.path.exists(self.path("regen.jsonl.state.json")))
        self.assertEqual(self.server.requests, [])
        empty = self.write_file("empty.jsonl", "")
        code, _, err = self.regenerate(empty)
        self.assertEqual(code, 2)
        self.assertIn(f"no usable conversation in {empty} (0 line(s) unusable)", err)

    def test_a_byte_order_mark_is_read_over(self):
        chat_path = self.path("bom.jsonl")
        with open(chat_path, "wb") as f:
            f.write(b"\xef\xbb\xbf" + json.dumps(conversation("u0")).encode() + b"\n")
        code, _, err = self.regenerate(chat_path)
        self.assertEqual(code, 0, err)
        self.assertEqual([line["source"] for line in self.output()], [f"{chat_path}:1"])
        self.assertNotIn("dropped", err)

    def test_usage_errors(self):
        chat_path = self.write_chat([conversation("u0")])
        err = io.StringIO()
        with redirect_stderr(err), redirect_stdout(io.StringIO()):
            code = cli.main(["regenerate", chat_path, "--out", self.path("o.jsonl"),
                             "--server", "localhost:8000"])
        self.assertEqual(code, 2)
        self.assertIn("needs --server URL and --model NAME", err.getvalue())
        err = io.StringIO()
        with redirect_stderr(err), redirect_stdout(io.StringIO()):
            code = cli.main(["regenerate", chat_path, "--out", self.path("o.jsonl"),
                             "--server", "localhost:8000", "--model", "m"])
        self.assertEqual(code, 2)
        self.assertIn("--server localhost:8000: not an http:// or https:// URL",
                      err.getvalue())


class FaultTest(RegenerateBase):
    """Each way a server, a file, a user or a signal can fail a run."""

    def state(self):
        with open(self.path("regen.jsonl") + ".state.json") as f:
            return json.load(f)

    def contents(self):
        return sorted(m["messages"][-1]["content"] for m in self.output())

    def test_a_trickling_answer_is_bounded_by_the_timeout(self):
        # A byte every 0.25 s kept each read under a 0.5 s socket timeout:
        # the request took as long as the server liked.
        chat_path = self.write_chat([conversation("trickle"), conversation("fine")])
        began = time.monotonic()
        code, _, err = self.regenerate(chat_path, "--concurrency", "2",
                                       "--timeout", self.SHORT_TIMEOUT)
        self.assertLess(time.monotonic() - began, 4)
        self.assertEqual(code, 0, err)
        self.assertEqual(self.contents(), ["A0: fine", "A0: trickle"])
        attempts = {json.loads(k)[-1]["content"]: n for k, n in self.server.attempts.items()}
        self.assertEqual(attempts["trickle"], 2)

    def test_retry_after_is_honoured_in_both_forms_and_capped(self):
        chat_path = self.write_chat([conversation("busy429"), conversation("busydate")])
        code, _, err = self.regenerate(chat_path, "--concurrency", "2")
        self.assertEqual(code, 0, err)
        self.assertEqual(len(self.output()), 2)
        gaps = {word: times[1] - times[0] for word, times in self.server.times.items()}
        self.assertGreater(gaps["busy429"], 0.9)  # Retry-After: 1
        self.assertGreater(gaps["busydate"], 0.9)  # an HTTP-date 1 to 2 s ahead
        long_path = self.write_chat([conversation("busylong")], name="long.jsonl")
        with mock.patch.object(regenerate_backends, "RETRY_AFTER_CAP", 0.2):
            code, _, err = self.regenerate(long_path, "--out", self.path("long.jsonl.out"))
        self.assertEqual(code, 0, err)
        times = self.server.times["busylong"]
        self.assertLess(times[1] - times[0], 0.9)  # 100000 s, capped
        self.assertIn("asks to wait 100000 s (Retry-After); waiting 0.2 s at most", err)

    def test_empty_answers_are_left_out_unless_kept(self):
        chat_path = self.write_chat([conversation("empty"), conversation("fine")])
        code, out, err = self.regenerate(chat_path)
        self.assertEqual(code, 0, err)
        self.assertEqual(self.contents(), ["A0: fine"])
        self.assertIn(f"{chat_path}:1: an empty answer", err)
        self.assertIn("1 empty answer(s) left out", err)
        report = self.state()["report"]
        self.assertEqual((report["empty_answers"], report["failed"]), (1, 1))
        # Keeping them makes no other answers: the run continues.
        code, out, err = self.regenerate(chat_path, "--keep-empty-answers")
        self.assertEqual(code, 0, err)
        self.assertEqual(self.contents(), ["", "A0: fine"])
        self.assertIn("1 regenerated, 1 already there, 0 failed", out)

    def test_a_body_that_is_not_utf8_is_named(self):
        # It was decoded with U+FFFD in place of the byte and written.
        chat_path = self.write_chat([conversation("badutf8"), conversation("fine")])
        code, _, err = self.regenerate(chat_path)
        self.assertEqual(code, 0, err)
        self.assertEqual(self.contents(), ["A0: fine"])
        self.assertIn(f"{chat_path}:1: malformed answer: the body is not UTF-8 (byte", err)
        self.assertEqual(self.state()["report"]["failure_kinds"], {"not-utf8": 1})

    def test_the_failure_list_says_what_it_leaves_out(self):
        chat_path = self.write_chat([conversation(f"bad400 {i}") for i in range(103)]
                                    + [conversation("fine")])
        code, _, err = self.regenerate(chat_path, "--concurrency", "8")
        self.assertEqual(code, 0, err)
        report = self.state()["report"]
        self.assertEqual((report["failed"], len(report["failures"]),
                          report["failures_not_listed"]), (103, 100, 3))

    def test_a_server_that_is_down_is_one_error(self):
        chat_path = self.write_chat([conversation(f"u{i}") for i in range(5)])
        began = time.monotonic()
        code, out, err = self.regenerate(chat_path, "--server",
                                         f"http://127.0.0.1:{closed_port()}")
        self.assertLess(time.monotonic() - began, 2)
        self.assertEqual(code, 2)
        self.assertEqual(err.count("error:"), 1, err)
        self.assertIn("cannot connect (ConnectionRefusedError", err)
        self.assertNotIn("warning", err)
        self.assertFalse(os.path.exists(self.path("regen.jsonl")))

    def test_a_server_that_goes_away_stops_the_run_keeping_what_is_written(self):
        chat_path = self.write_chat([conversation("fine0"), conversation("fine1"),
                                     conversation("vanish"), conversation("fine2"),
                                     conversation("fine3")])
        code, out, err = self.regenerate(chat_path, "--concurrency", "1")
        self.assertEqual(code, 2, err)
        self.assertEqual(err.count("error:"), 1, err)
        self.assertIn("connection refused (3 attempts): the server is gone", err)
        self.assertNotIn("warning", err)
        self.assertEqual(self.contents(), ["A0: fine0", "A0: fine1"])
        report = self.state()["report"]
        self.assertEqual((report["regenerated"], report["failed"], report["not_finished"]),
                         (2, 0, 3))

    def test_a_redirect_names_where_it_points(self):
        chat_path = self.write_chat([conversation("moved"), conversation("fine")])
        code, _, err = self.regenerate(chat_path, "--concurrency", "1")
        self.assertEqual(code, 2)
        self.assertIn("answers HTTP 307, to 'http://elsewhere/v1': give that as --server", err)
        self.assertEqual(err.count("error:"), 1, err)

    def test_a_model_the_server_lacks_stops_the_run_and_binds_nothing(self):
        chat_path = self.write_chat([conversation(f"u{i}") for i in range(5)])
        # Listed at /v1/models: refused before anything is asked or written.
        code, _, err = self.regenerate(chat_path, "--model", "wrong")
        self.assertEqual(code, 2)
        self.assertIn("--model wrong: not served by", err)
        self.assertIn("lists: stand-in", err)
        self.assertEqual(self.server.requests, [])
        self.assertFalse(os.path.exists(self.path("regen.jsonl.state.json")))
        # Not listed: the first answers' 404 stop it, one error, not five
        # warnings after retries.
        self.server.list_models = False
        code, _, err = self.regenerate(chat_path, "--model", "wrong", "--concurrency", "2")
        self.assertEqual(code, 2)
        self.assertEqual(err.count("error:"), 1, err)
        self.assertIn("HTTP 404", err)
        self.assertIn("does not serve that model", err)
        self.assertNotIn("warning", err)
        self.assertLessEqual(len(self.server.requests), 2)
        # One worker: the 404 stops it before it takes the next conversation,
        # however late the main thread drains the queue.
        del self.server.requests[:]
        code, _, err = self.regenerate(chat_path, "--model", "wrong", "--concurrency", "1")
        self.assertEqual(code, 2)
        self.assertEqual(len(self.server.requests), 1)
        # That run wrote no answer: the right --model continues, no --overwrite.
        code, _, err = self.regenerate(chat_path)
        self.assertEqual(code, 0, err)
        self.assertIn("wrote no answer, so its options bind nothing", err)
        self.assertEqual(len(self.output()), 5)

    def test_moving_the_server_continues_the_run(self):
        chat_path = self.write_chat([conversation("fine0"), conversation("fail500"),
                                     conversation("fine1")])
        code, _, err = self.regenerate(chat_path, "--retries", "0")
        self.assertEqual(code, 0, err)
        self.assertEqual(self.contents(), ["A0: fine0", "A0: fine1"])
        moved = StandInServer(client_timeout=0.5)
        try:
            for url in (f"http://localhost:{moved.port}/v1/", f"{moved.url}/v1"):
                code, out, err = self.regenerate(chat_path, "--server", url)
                self.assertEqual(code, 0, err)
            # fail500 alone is asked, on the new port (it fails once there too).
            self.assertEqual({r["messages"][-1]["content"] for r in moved.requests},
                             {"fail500"})
        finally:
            moved.close()
        sources = [line["source"] for line in self.output()]
        self.assertEqual(sorted(sources), [f"{chat_path}:{n}" for n in (1, 2, 3)])
        # What binds is the answers: another model is still another run
        # (past a server that does not list its models).
        self.server.list_models = False
        code, _, err = self.regenerate(chat_path, "--model", "other")
        self.assertEqual(code, 2)
        self.assertIn("written by a run with other --model", err)

    def test_renamed_inputs_with_the_same_content_continue(self):
        chat_path = self.write_chat([conversation("fine0"), conversation("fail500")])
        self.assertEqual(self.regenerate(chat_path, "--retries", "0")[0], 0)
        moved = self.path("moved.jsonl")
        os.rename(chat_path, moved)
        code, out, err = self.regenerate(moved)
        self.assertEqual(code, 0, err)
        self.assertIn("1 regenerated, 1 already there", out)
        self.assertEqual(sorted(line["source"] for line in self.output()),
                         [f"{chat_path}:1", f"{moved}:2"])
        with open(moved, "a") as f:  # other content: another run
            f.write(json.dumps(conversation("new")) + "\n")
        code, _, err = self.regenerate(moved)
        self.assertEqual(code, 2)
        self.assertIn("written by a run with other inputs (by content)", err)

    def test_a_run_of_the_first_version_continues(self):
        # Its state bound the inputs' paths, sizes and times, and the server.
        chat_path = self.write_chat([conversation("fine0"), conversation("fine1")])
        info = os.stat(chat_path)
        run = {"inputs": [[os.path.abspath(chat_path), info.st_size, info.st_mtime_ns]],
               "input_names": [chat_path], "backend": "server", "server": "http://old:1",
               "model": "stand-in", "target": None, "dtype": None, "temperature": 0.0,
               "top_p": 1.0, "max_tokens": 2048, "template_options": {},
               "last_turn_only": False}
        with open(self.path("regen.jsonl.state.json"), "w") as f:
            json.dump({"fingerprint": "0" * 64, "run": run}, f)
        with open(self.path("regen.jsonl"), "w") as f:
            f.write(json.dumps({"messages": [], "source": f"{chat_path}:1"}) + "\n")
        code, out, err = self.regenerate(chat_path)
        self.assertEqual(code, 0, err)
        self.assertIn("1 regenerated, 1 already there", out)

    def test_a_missing_read_only_or_full_output_directory_is_one_line(self):
        chat_path = self.write_chat([conversation(f"fine{i}") for i in range(4)])
        missing = self.path("nowhere", "regen.jsonl")
        code, _, err = self.regenerate(chat_path, "--out", missing)
        self.assertEqual(code, 2)
        self.assertEqual(err, f"dflash-prepare: error: --out {missing}: the directory "
                         f"{self.path('nowhere')} does not exist\n")
        if os.geteuid() != 0:  # root writes anywhere
            os.makedirs(self.path("locked"))
            os.chmod(self.path("locked"), 0o555)
            try:
                code, _, err = self.regenerate(chat_path, "--out",
                                               self.path("locked", "regen.jsonl"))
            finally:
                os.chmod(self.path("locked"), 0o755)
            self.assertEqual(code, 2)
            self.assertIn(f"cannot write in {self.path('locked')}", err)
            self.assertEqual(err.count("\n"), 1)
        self.assertEqual(self.server.requests, [])
        # The disk fills on the third line, half of it written.
        real_write = os.write
        calls = []

        def full_disk(fd, data):
            if data.startswith(b'{"messages"'):
                calls.append(data)
                if len(calls) == 3:
                    real_write(fd, data[:len(data) // 2])
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            return real_write(fd, data)

        with mock.patch.object(regenerate.os, "write", full_disk):
            code, out, err = self.regenerate(chat_path, "--concurrency", "1")
        self.assertEqual(code, 2)
        self.assertNotIn("Traceback", err)
        self.assertIn(f"{self.path('regen.jsonl')}: cannot write: No space left on device; "
                      "the lines written before are kept", err)
        self.assertEqual(err.count("error:"), 1, err)
        self.assertEqual(len(self.output()), 2)  # whole lines only
        code, out, err = self.regenerate(chat_path)
        self.assertEqual(code, 0, err)
        self.assertIn("2 regenerated, 2 already there", out)
        self.assertEqual(self.contents(), [f"A0: fine{i}" for i in range(4)])


class ProcessTest(RegenerateBase):
    """The tool as a process: locks, signals and kills."""

    # Longer than the stand-in's hang (30 s): a process asking a "hang"
    # conversation never retries it while a test runs, however loaded the
    # machine (a retry would count as a second request).
    PROCESS_TIMEOUT = "60"

    def start(self, chat_path, *extra):
        command = [sys.executable, PREPARE, "regenerate", chat_path,
                   "--out", self.path("regen.jsonl"), "--server", self.server.url,
                   "--model", "stand-in", "--timeout", self.PROCESS_TIMEOUT, "--retries", "1",
                   "--retry-backoff", "0.01", *extra]
        return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, env=dict(os.environ, DFLASH_DATA_VENV="none"))

    def wait_for(self, condition, seconds=20):
        deadline = time.monotonic() + seconds
        while not condition():
            self.assertLess(time.monotonic(), deadline, "waited too long")
            time.sleep(0.02)

    def lines(self):
        try:
            with open(self.path("regen.jsonl")) as f:
                return f.read().count("\n")
        except FileNotFoundError:
            return 0

    def test_a_second_run_into_the_same_output_is_refused_naming_the_first(self):
        chat_path = self.write_chat([conversation("hang")])
        first = self.start(chat_path)
        try:
            self.wait_for(lambda: self.server.requests)
            code, _, err = self.regenerate(chat_path)
            self.assertEqual(code, 2)
            self.assertIn(f"{self.path('regen.jsonl.lock')}: the output is in use by "
                          f"dflash-prepare regenerate, process {first.pid} on "
                          f"{socket.gethostname()}, started ", err)
            self.assertEqual(len(self.server.requests), 1)
        finally:
            first.send_signal(signal.SIGTERM)
            first.communicate(timeout=10)

    def test_a_stale_lock_is_taken_over(self):
        chat_path = self.write_chat([conversation("fine")])
        gone = subprocess.Popen([sys.executable, "-c", "pass"])
        gone.wait()
        stale = {"command": "regenerate", "pid": gone.pid, "host": socket.gethostname(),
                 "started": "2001-01-01 00:00:00 UTC"}
        lock = self.path("regen.jsonl.lock")
        with open(lock, "w") as f:
            json.dump(stale, f)
        code, _, err = self.regenerate(chat_path)
        self.assertEqual(code, 0, err)
        self.assertIn(f"took over the lock of dflash-prepare regenerate, process {gone.pid}",
                      err)
        self.assertFalse(os.path.exists(lock))
        # Another host's record cannot be judged from here: refused.
        with open(lock, "w") as f:
            json.dump(dict(stale, host="elsewhere"), f)
        code, _, err = self.regenerate(chat_path)
        self.assertEqual(code, 2)
        self.assertIn("on elsewhere", err)
        self.assertIn(f"if that run has ended, remove {lock}", err)

    def test_sigint_and_sigterm_stop_within_seconds_with_a_report(self):
        for number in (signal.SIGINT, signal.SIGTERM):
            with self.subTest(signal=number.name):
                for name in ("regen.jsonl", "regen.jsonl.state.json"):
                    if os.path.exists(self.path(name)):
                        os.remove(self.path(name))
                # Two turns each: a stopped conversation must not ask its second.
                chat_path = self.write_chat(
                    [conversation(f"fine{i}", "next") for i in range(3)]
                    + [conversation(f"hang{i}", "next") for i in range(3)],
                    name=f"chat-{number.name}.jsonl")
                process = self.start(chat_path, "--concurrency", "6")
                hanging = [f"hang{i}" for i in range(3)]
                self.wait_for(lambda: self.lines() == 3 and all(
                    h in self.server.times for h in hanging))
                asked = len(self.server.requests)
                self.server.times.clear()
                process.send_signal(number)
                began = time.monotonic()
                _, err = process.communicate(timeout=10)
                self.assertLess(time.monotonic() - began, 3)
                self.assertEqual(process.returncode, 128 + number, err)
                self.assertIn(f"{number.name}: stopping", err)
                self.assertNotIn("Traceback", err)
                self.assertEqual(len(self.server.requests), asked)  # nothing asked after
                self.assertEqual(len(self.output()), 3)
                report = self.state()["report"]
                self.assertEqual((report["stopped"], report["regenerated"], report["failed"],
                                  report["not_finished"]), (number.name, 3, 0, 3))
                self.assertFalse(os.path.exists(self.path("regen.jsonl.lock")))

    def state(self):
        with open(self.path("regen.jsonl") + ".state.json") as f:
            return json.load(f)

    def test_a_second_signal_ends_the_process_at_once(self):
        # The first asks for a stop; a stop that hangs is cut short by the second.
        code = ("import os, signal, sys, time\n"
                f"sys.path.insert(0, {helpers.TOOL_DIR!r})\n"
                "from dflash_prepare.regenerate import Signals\n"
                "with Signals():\n"
                "    os.kill(os.getpid(), signal.SIGINT)\n"
                "    time.sleep(0.2)\n"
                "    print('first seen', flush=True)\n"
                "    os.kill(os.getpid(), signal.SIGTERM)\n"
                "    time.sleep(30)\n")
        began = time.monotonic()
        result = subprocess.run([sys.executable, "-c", code], capture_output=True,
                                text=True, timeout=20)
        self.assertLess(time.monotonic() - began, 5)
        self.assertEqual(result.returncode, -signal.SIGTERM)
        self.assertEqual(result.stdout, "first seen\n")

    def test_killed_mid_write_several_times_then_rerun_loses_nothing_unnamed(self):
        good = [conversation(f"delay{i}", f"delay{i} again") for i in range(16)]
        faulty = [conversation(w) for w in ("malformed", "badutf8", "empty", "surrogate",
                                            "bad400", "always500")]
        records = good[:8] + faulty + good[8:] + ["{not json"]
        chat_path = self.write_chat(records)
        faulty_sources = {f"{chat_path}:{n}" for n in range(9, 15)}
        usable = {f"{chat_path}:{n}" for n in range(1, 23)}
        took_over = 0
        for round in range(4):
            before = self.lines()
            process = self.start(chat_path, "--concurrency", "2")
            self.wait_for(lambda: self.lines() >= before + 2 or process.poll() is not None)
            process.send_signal(signal.SIGKILL)
            _, err = process.communicate(timeout=10)
            took_over += "took over the lock" in err
            if round % 2 == 0:  # as if the kill landed inside a write
                with open(self.path("regen.jsonl"), "a") as f:
                    f.write('{"messages": [{"role": "user", "conte')
        self.assertGreaterEqual(took_over, 3)  # each kill left its lock behind
        self.assertLess(self.lines(), len(usable))
        code, out, err = self.regenerate(chat_path, "--concurrency", "8")
        self.assertEqual(code, 0, err)
        self.assertIn("took over the lock", err)
        with open(self.path("regen.jsonl")) as f:
            raw = f.read()
        self.assertTrue(raw.endswith("\n"))
        lines = [json.loads(line) for line in raw.splitlines()]  # none cut
        sources = [line["source"] for line in lines]
        self.assertEqual(len(sources), len(set(sources)))  # each once
        self.assertEqual(set(sources), usable - faulty_sources)
        for line in lines:  # both turns the target's
            self.assertEqual([m["content"][:3] for m in line["messages"][1::2]],
                             ["A0:", "A1:"])
        report = self.state()["report"]
        self.assertEqual(report["conversations"], len(usable))
        self.assertEqual(report["regenerated"] + report["already_done"] + report["failed"]
                         + report["not_finished"], report["conversations"])
        self.assertEqual(report["not_finished"], 0)
        self.assertEqual({f["source"] for f in report["failures"]}, faulty_sources)
        self.assertEqual(report["unusable_lines"], 1)


class PartsTest(unittest.TestCase):
    def test_endpoint_forms(self):
        from dflash_prepare.regenerate_backends import chat_completions_url
        for given in ("http://h:1", "http://h:1/", "http://h:1/v1",
                      "http://h:1/v1/chat/completions"):
            self.assertEqual(chat_completions_url(given), "http://h:1/v1/chat/completions")

    def test_retry_after_forms(self):
        from dflash_prepare.regenerate_backends import retry_after_seconds
        now = 1_700_000_000.0
        self.assertEqual(retry_after_seconds("7", now), 7.0)
        self.assertEqual(retry_after_seconds(email.utils.formatdate(now + 30, usegmt=True),
                                             now), 30.0)
        self.assertEqual(retry_after_seconds(email.utils.formatdate(now - 30, usegmt=True),
                                             now), 0.0)
        for bad in (None, "", "soon", "nan"):
            self.assertIsNone(retry_after_seconds(bad, now))

    def test_reasoning_split(self):
        from dflash_prepare.regenerate_backends import split_reasoning
        self.assertEqual(split_reasoning("<think>\nhm\n</think>\n\nyes"), ("hm", "yes"))
        self.assertEqual(split_reasoning("hm\n</think>\n\nyes"), ("hm", "yes"))
        self.assertEqual(split_reasoning("<think>\n\n</think>\n\nyes"), (None, "yes"))
        self.assertEqual(split_reasoning("just text"), (None, "just text"))

    def test_tool_call_turns_followed_by_results_are_kept(self):
        from dflash_prepare.regenerate import turns_to_answer
        messages = [{"role": "user", "content": "q"},
                    {"role": "assistant", "content": None, "tool_calls": [{}]},
                    {"role": "tool", "content": "r"},
                    {"role": "assistant", "content": "a"}]
        self.assertEqual(turns_to_answer(messages, False), [3])
        self.assertEqual(turns_to_answer(messages[:2], False), [1])
        self.assertEqual(turns_to_answer(messages, True), [3])


if __name__ == "__main__":
    unittest.main()
