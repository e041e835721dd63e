"""dflash-prepare regenerate against a stand-in OpenAI-compatible server: a
real HTTP server on 127.0.0.1 (http.server), started by each test. The
servers meant are vLLM and SGLang; this one answers from the request alone
and misbehaves on cue: the last user message names what it does (slow,
fail500, drop, malformed, surrogate, deep, always500, bad400, delay)."""
import http.server
import io
import json
import os
import signal
import subprocess
import sys
import threading
import time
import unittest
from contextlib import redirect_stderr, redirect_stdout

import helpers  # noqa: F401  (imports the checkout's dflash_prepare)
from helpers import PREPARE, TempDir

from dflash_prepare import chat, cli


class StandInServer:
    """Counts attempts per user message, in-flight requests and their peak."""

    def __init__(self, client_timeout):
        self.client_timeout = client_timeout
        self.lock = threading.Lock()
        self.attempts = {}
        self.requests = []
        self.in_flight = 0
        self.peak = 0
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                server.answer(self, body)

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()

    def answer(self, handler, body):
        user = [m["content"] for m in body["messages"] if m["role"] == "user"][-1]
        key = json.dumps(body["messages"])
        with self.lock:
            attempt = self.attempts[key] = self.attempts.get(key, 0) + 1
            self.requests.append(body)
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
        turn = sum(m["role"] == "assistant" for m in body["messages"])
        message = {"role": "assistant", "content": f"A{turn}: {user}",
                   "reasoning_content": f"thinking about {user}"}
        reply = {"choices": [{"message": message, "finish_reason": "stop"}],
                 "usage": {"completion_tokens": 5}}
        self.send(handler, 200, json.dumps(reply).encode())

    @staticmethod
    def send(handler, status, payload):
        handler.send_response(status)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(payload)))
        handler.end_headers()
        handler.wfile.write(payload)


def conversation(*users, system=None):
    messages = [{"role": "system", "content": system}] if system else []
    for i, text in enumerate(users):
        messages += [{"role": "user", "content": text},
                     {"role": "assistant", "content": f"original {i}"}]
    return {"messages": messages}


class RegenerateTest(TempDir):
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
                "--server", self.server.url, "--model", "stand-in", "--timeout", "0.5",
                "--retries", "2", "--retry-backoff", "0.01", *extra]
        out, err = io.StringIO(), io.StringIO()
        with redirect_stdout(out), redirect_stderr(err):
            code = cli.main(args)
        return code, out.getvalue(), err.getvalue()

    def output(self):
        with open(self.path("regen.jsonl")) as f:
            return [json.loads(line) for line in f]

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
        code, _, err = self.regenerate(chat_path, "--concurrency", "4")
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
            if os.path.exists(out_path) and open(out_path).read().count("\n") >= 4:
                break
            time.sleep(0.02)
        process.send_signal(signal.SIGKILL)
        process.wait()
        before = open(out_path).read().count("\n")
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
        self.assertIn("written by a run with other inputs or options", err)
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


class PartsTest(unittest.TestCase):
    def test_endpoint_forms(self):
        from dflash_prepare.regenerate_backends import chat_completions_url
        for given in ("http://h:1", "http://h:1/", "http://h:1/v1",
                      "http://h:1/v1/chat/completions"):
            self.assertEqual(chat_completions_url(given), "http://h:1/v1/chat/completions")

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
