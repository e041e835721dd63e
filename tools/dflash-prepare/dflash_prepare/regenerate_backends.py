"""Where `dflash-prepare regenerate` gets the target's answers.

- ServerBackend: an OpenAI-compatible chat-completions server (vLLM,
  SGLang) over HTTP, with the standard library only. `probe` checks, before
  the run, that the server answers and serves --model (GET /v1/models where
  offered). Each attempt is bounded as a whole by --timeout (a watchdog
  shuts its socket down, so a server trickling bytes cannot hold it); a
  timeout, a dropped connection, 429 and 5xx are retried with exponential
  backoff, or after the server's Retry-After on 429 and 503 (at most
  RETRY_AFTER_CAP seconds); other 4xx answers and malformed answers (not
  json, not UTF-8, no message) fail the request at once. 401, 403 and 404
  (no such model, or not a chat-completions endpoint) and a server that
  refuses connections to the last attempt are the run's problem
  (ServerUnusable), not the conversation's.
- TransformersBackend: greedy (or sampled) `generate` of a local Hugging
  Face target; requests from many threads are batched on one GPU thread.

Both answer `complete(messages, tools)` with an Answer or raise
RequestFailed (the conversation's failure), ServerUnusable or Stopped
(after `stop()`, which also ends the requests in flight); both are safe to
call from several threads.
"""
import concurrent.futures
import datetime
import email.utils
import http.client
import json
import math
import queue
import random
import socket
import threading
import time
import urllib.parse

from .errors import UserError, note, require, require_torch2

# The longest wait a server's Retry-After gets (seconds): a server asking
# for more is retried after this anyway (a rerun continues what fails).
RETRY_AFTER_CAP = 300.0
# Connecting is quick or not at all; a stop waits for it at most this long.
CONNECT_TIMEOUT = 10.0


class RequestFailed(Exception):
    """A conversation's request failed for good (after any retries); `kind`
    counts it in the report (timeout, connection, http, malformed,
    not-utf8, empty, template, generate, internal)."""

    def __init__(self, why, kind="failed"):
        super().__init__(why)
        self.kind = kind


class ServerUnusable(Exception):
    """No request can succeed (the server is gone, or does not serve the
    model): the run stops with this one error."""


class Stopped(Exception):
    """The run is stopping: the conversation is neither written nor failed."""


class Answer:
    def __init__(self, content, reasoning=None, tool_calls=None, completion_tokens=0,
                 truncated=False, retokenized_differs=False):
        self.content = content
        # The answer's text does not tokenize back to the tokens generated
        # (known only to the transformers backend): the data then holds
        # tokens the target did not produce in that order.
        self.retokenized_differs = retokenized_differs
        self.reasoning = reasoning
        self.tool_calls = tool_calls
        self.completion_tokens = completion_tokens
        self.truncated = truncated


def chat_completions_url(url):
    """`URL` as the chat-completions endpoint: a server root or its /v1 gets
    /v1/chat/completions; a full endpoint stays as it is."""
    if not url.startswith(("http://", "https://")):
        raise UserError(f"--server {url}: not an http:// or https:// URL")
    url = url.rstrip("/")
    if url.endswith("/chat/completions"):
        return url
    if url.endswith("/v1"):
        return url + "/chat/completions"
    return url + "/v1/chat/completions"


def split_reasoning(text):
    """(reasoning, content) of generated text: the part before `</think>`
    (its `<think>` removed) is the reasoning, where there is one."""
    if "</think>" not in text:
        return None, text
    thought, _, content = text.partition("</think>")
    thought = thought.replace("<think>", "", 1).strip("\n")
    return (thought or None), content.lstrip("\n")


def retry_after_seconds(value, now=None):
    """Seconds a Retry-After header asks for (its seconds form, or an
    HTTP-date), or None where it says neither."""
    if not value:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError, OverflowError):
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=datetime.timezone.utc)
        now = now if now is not None else time.time()
        seconds = when.timestamp() - now
    if math.isnan(seconds):
        return None
    return max(0.0, seconds)


def parse_answer(payload):
    """An Answer from a chat-completions response body (bytes), or
    RequestFailed saying what is wrong with it."""
    try:
        payload = payload.decode("utf-8")
    except UnicodeDecodeError as error:
        raise RequestFailed(f"malformed answer: the body is not UTF-8 (byte {error.start + 1}: "
                            f"{payload[error.start:error.start + 4]!r})", "not-utf8") from None
    try:
        body = json.loads(payload)
    except ValueError:
        raise RequestFailed("malformed answer: the body is not json "
                            f"({payload[:60]!r})", "malformed") from None
    except RecursionError:
        raise RequestFailed("malformed answer: the body nests deeper than python's "
                            "json reader follows", "malformed") from None
    choices = body.get("choices") if isinstance(body, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise RequestFailed("malformed answer: no choices[0]", "malformed")
    message = choices[0].get("message")
    if not isinstance(message, dict):
        raise RequestFailed("malformed answer: choices[0] has no message object", "malformed")
    content = message.get("content")
    calls = message.get("tool_calls") or None
    if content is not None and not isinstance(content, str):
        raise RequestFailed(f"malformed answer: content is a {type(content).__name__}",
                            "malformed")
    if calls is not None and not isinstance(calls, list):
        raise RequestFailed("malformed answer: tool_calls is not a list", "malformed")
    if content is None and not calls:
        raise RequestFailed("malformed answer: neither content nor tool_calls", "malformed")
    # vLLM and SGLang name the parsed reasoning either way.
    reasoning = message.get("reasoning_content", message.get("reasoning"))
    if reasoning is not None and not isinstance(reasoning, str):
        raise RequestFailed("malformed answer: reasoning_content is not a string", "malformed")
    try:
        # JSON may escape a lone surrogate ("\udc00"), which no UTF-8 output
        # can hold: the answer's failure, not the run's.
        json.dumps([content, reasoning, calls], ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise RequestFailed("malformed answer: a lone surrogate escape in its text "
                            "(not a unicode character)", "malformed") from None
    except (RecursionError, ValueError):
        raise RequestFailed("malformed answer: tool_calls nest too deep", "malformed") from None
    usage = body.get("usage") if isinstance(body.get("usage"), dict) else {}
    tokens = usage.get("completion_tokens")
    return Answer(content, reasoning or None, calls,
                  tokens if isinstance(tokens, int) and tokens >= 0 else 0,
                  choices[0].get("finish_reason") == "length")


class _TimedOut(Exception):
    pass


class _Exchange:
    """One HTTP request and its answer, which another thread can end (its
    watchdog at the deadline, or a stop) by shutting its socket down: a
    blocked read then returns at once, whatever the server sends."""

    def __init__(self):
        self.lock = threading.Lock()
        self.sock = None
        self.ended = None  # why it was ended: "timeout" or "stop"
        self.finished = False

    def attach(self, sock):
        with self.lock:
            self.sock = sock
            ended = self.ended
        if ended:
            self.end(ended, again=True)

    def end(self, why, again=False):
        with self.lock:
            if self.finished or (self.ended and not again):
                return
            self.ended = why
            sock = self.sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def finish(self):
        """Why it was ended, if it was; no end counts after this."""
        with self.lock:
            self.finished = True
            return self.ended


class ServerBackend:
    def __init__(self, url, model, timeout=600.0, retries=4, backoff=1.0,
                 temperature=0.0, top_p=1.0, max_tokens=2048, template_options=None):
        self.url = url
        self.endpoint = chat_completions_url(url)
        parts = urllib.parse.urlsplit(self.endpoint)
        if not parts.hostname:
            raise UserError(f"--server {url}: no host in the URL")
        try:
            parts.port
        except ValueError:
            raise UserError(f"--server {url}: not a port number") from None
        self.parts = parts
        self.models_path = parts.path[:-len("/chat/completions")] + "/models"
        self.model = model
        self.timeout = timeout
        self.retries = retries
        self.backoff = backoff
        self.sampling = {"temperature": temperature, "top_p": top_p,
                         "max_tokens": max_tokens}
        self.template_options = template_options or {}
        self.stopping = threading.Event()
        self.lock = threading.Lock()
        self.exchanges = set()
        self.capped_once = False

    def _connection(self):
        kind = (http.client.HTTPSConnection if self.parts.scheme == "https"
                else http.client.HTTPConnection)
        return kind(self.parts.hostname, self.parts.port,
                    timeout=min(self.timeout, CONNECT_TIMEOUT))

    def _exchange(self, method, path, data, limit):
        """(status, headers, body bytes) of one request, ended after `limit`
        seconds (_TimedOut) or by stop() (Stopped)."""
        exchange = _Exchange()
        with self.lock:
            if self.stopping.is_set():
                raise Stopped()
            self.exchanges.add(exchange)
        watchdog = threading.Timer(limit, exchange.end, ("timeout",))
        watchdog.daemon = True
        watchdog.start()
        connection = self._connection()
        try:
            try:
                connection.connect()
                exchange.attach(connection.sock)
                connection.sock.settimeout(limit)
                headers = {"Content-Type": "application/json"} if data is not None else {}
                connection.request(method, path, body=data, headers=headers)
                response = connection.getresponse()
                status, reply = response.status, response.headers
                payload = response.read()
            except (OSError, http.client.HTTPException):
                ended = exchange.finish()
                if ended == "stop":
                    raise Stopped() from None
                if ended == "timeout":
                    raise _TimedOut() from None
                raise
            ended = exchange.finish()
            if ended == "stop":
                raise Stopped()
            if ended == "timeout":
                raise _TimedOut()
            return status, reply, payload
        finally:
            watchdog.cancel()
            connection.close()
            with self.lock:
                self.exchanges.discard(exchange)

    def probe(self):
        """Refuses a server that cannot be reached, or whose /v1/models does
        not list --model, before anything is asked (one error, not a retry
        and a warning per conversation)."""
        limit = min(self.timeout, 30.0)
        try:
            status, _, payload = self._exchange("GET", self.models_path, None, limit)
        except _TimedOut:
            note(f"{self.url}: no answer to GET {self.models_path} within {limit:g} s; "
                 "going on (the first requests will tell)")
            return
        except (OSError, http.client.HTTPException) as error:
            raise UserError(f"--server {self.url}: cannot connect ({type(error).__name__}: "
                            f"{error}); is the server running there?") from None
        if status != 200:
            return  # not offered: the first request's 404 tells instead
        try:
            served = [m.get("id") for m in json.loads(payload)["data"]]
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError):
            return
        if self.model not in served:
            names = ", ".join(str(n) for n in served[:10]) or "none"
            raise UserError(f"--model {self.model}: not served by {self.url} "
                            f"(GET {self.models_path} lists: {names})")

    def complete(self, messages, tools=None):
        body = dict(self.sampling, model=self.model, messages=messages)
        if tools:
            body["tools"] = tools
        if self.template_options:
            # vLLM's and SGLang's name for the chat template's options.
            body["chat_template_kwargs"] = self.template_options
        data = json.dumps(body).encode()
        why, kind, asked = None, "failed", None
        for attempt in range(self.retries + 1):
            if attempt:
                delay = asked if asked is not None else \
                    self.backoff * 2 ** (attempt - 1) * (0.5 + random.random())
                if self.stopping.wait(delay):
                    raise Stopped()
            asked = None
            try:
                status, headers, payload = self._exchange("POST", self.parts.path, data,
                                                          self.timeout)
            except _TimedOut:
                why, kind = f"no whole answer within --timeout {self.timeout:g} s", "timeout"
                continue
            except ConnectionRefusedError:
                why, kind = "connection refused", "down"
                continue
            except (OSError, http.client.HTTPException) as error:
                why = f"connection failed ({type(error).__name__}: {error})"
                kind = "connection"
                continue
            if status == 200:
                return parse_answer(payload)
            text = payload.decode("utf-8", "replace").strip()[:120]
            why, kind = f"HTTP {status} ({text!r})", "http"
            if 300 <= status < 400:  # followed by urllib, not here: say where to point
                raise ServerUnusable(f"{self.endpoint} answers HTTP {status}, to "
                                     f"{headers.get('Location')!r}: give that as --server")
            if status in (401, 403, 404):
                raise ServerUnusable(
                    f"{self.endpoint} answers {why} for --model {self.model}: the server "
                    "does not serve that model, is not a chat-completions endpoint, or "
                    "refuses this client; every request would fail")
            if status in (429, 503):
                asked = self._retry_after(headers.get("Retry-After"))
            if status != 429 and status < 500:
                raise RequestFailed(why, kind)
        if kind == "down":
            raise ServerUnusable(f"{self.endpoint}: connection refused ({self.retries + 1} "
                                 "attempts): the server is gone")
        raise RequestFailed(f"{why}, after {self.retries + 1} attempts", kind)

    def _retry_after(self, header):
        seconds = retry_after_seconds(header)
        if seconds is not None and seconds > RETRY_AFTER_CAP:
            if not self.capped_once:
                self.capped_once = True
                note(f"{self.url} asks to wait {seconds:.0f} s (Retry-After); waiting "
                     f"{RETRY_AFTER_CAP:g} s at most")
            seconds = RETRY_AFTER_CAP
        return seconds

    def stop(self):
        """Ends the requests in flight; later requests raise Stopped."""
        with self.lock:
            self.stopping.set()
            exchanges = list(self.exchanges)
        for exchange in exchanges:
            exchange.end("stop")

    def close(self):
        pass


class TransformersBackend:
    """The target's `generate`, one batch of up to `batch` prompts at a time."""

    def __init__(self, target, device="auto", dtype="auto", batch=8, temperature=0.0,
                 top_p=1.0, max_tokens=2048, template_options=None):
        from . import template
        self.torch = torch = require_torch2("--backend transformers")
        transformers = require("transformers", "--backend transformers")
        self.tokenizer = template.load_tokenizer(target)
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        if dtype == "auto":
            dtype = "bfloat16" if device.startswith("cuda") else "float32"
        # A random or weak target's logits are nearly tied: bf16 and fp32 greedy
        # answers part within a few tokens, so float32 is offered to match
        # serve-check (whose default is float32).
        dtype = getattr(torch, dtype)
        torch.backends.cuda.matmul.allow_tf32 = False
        try:
            self.model = transformers.AutoModelForCausalLM.from_pretrained(
                target, dtype=dtype, local_files_only=True).to(device).eval()
        except Exception as error:  # transformers raises many kinds here
            first = (str(error).strip().splitlines() or [type(error).__name__])[0]
            raise UserError(f"{target}: cannot load the target model: {first}") from None
        self.device = device
        ends = [t for t in template.end_of_turn_tokens(target)
                if self.tokenizer.convert_tokens_to_ids(t) is not None]
        self.eos = sorted({self.tokenizer.convert_tokens_to_ids(t) for t in ends})
        if not self.eos:
            raise UserError(f"{target}: the tokenizer has no end-of-turn token to stop at")
        self.pad = self.tokenizer.pad_token_id
        if self.pad is None:
            self.pad = self.eos[0]
        self.batch = batch
        self.sampling = dict(temperature=temperature, top_p=top_p, max_tokens=max_tokens)
        self.template_options = template_options or {}
        self.requests = queue.Queue()
        self.lock = threading.Lock()
        self.stopping = False
        self.waiting = set()  # the futures of complete() calls not yet answered
        self.worker = threading.Thread(target=self._serve, daemon=True)
        self.worker.start()

    def complete(self, messages, tools=None):
        try:
            prompt = self.tokenizer.apply_chat_template(
                messages, tools=tools, tokenize=False, add_generation_prompt=True,
                **self.template_options)
        except Exception as error:  # jinja2 errors, the template's raise_exception
            raise RequestFailed(f"the chat template failed: {error}", "template") from None
        future = concurrent.futures.Future()
        with self.lock:
            if self.stopping:
                raise Stopped()
            self.waiting.add(future)
        self.requests.put((prompt, future))
        try:
            return future.result()
        finally:
            with self.lock:
                self.waiting.discard(future)

    @staticmethod
    def _settle(future, result=None, error=None):
        """Sets a future that stop() may have failed already."""
        try:
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(result)
        except concurrent.futures.InvalidStateError:
            pass

    def _serve(self):
        while True:
            first = self.requests.get()
            if first is None:
                return
            work = [first]
            while len(work) < self.batch:
                try:
                    item = self.requests.get(timeout=0.02)
                except queue.Empty:
                    break
                if item is None:
                    self.requests.put(None)
                    break
                work.append(item)
            if self.stopping:
                continue  # stop() failed these already
            try:
                answers = self._generate([prompt for prompt, _ in work])
            except Exception as error:  # a CUDA or generate error fails the batch
                for _, future in work:
                    self._settle(future, error=RequestFailed(f"generate failed: {error}",
                                                             "generate"))
                continue
            for (_, future), answer in zip(work, answers):
                self._settle(future, answer)

    def _generate(self, prompts):
        torch = self.torch
        self.tokenizer.padding_side = "left"
        encoded = self.tokenizer(prompts, return_tensors="pt", padding=True,
                                 add_special_tokens=False).to(self.device)
        sample = self.sampling["temperature"] > 0
        extra = dict(temperature=self.sampling["temperature"],
                     top_p=self.sampling["top_p"]) if sample else {}
        with torch.no_grad():
            out = self.model.generate(**encoded, max_new_tokens=self.sampling["max_tokens"],
                                      do_sample=sample, eos_token_id=self.eos,
                                      pad_token_id=self.pad, **extra)
        start = encoded["input_ids"].shape[1]
        answers = []
        for row in out[:, start:].tolist():
            stop = next((i for i, t in enumerate(row) if t in self.eos), None)
            ids = row if stop is None else row[:stop]
            text = self.tokenizer.decode(ids, skip_special_tokens=True,
                                         clean_up_tokenization_spaces=False)
            reasoning, content = split_reasoning(text)
            again = self.tokenizer(text, add_special_tokens=False)["input_ids"]
            answers.append(Answer(content, reasoning, None,
                                  len(ids) + (stop is not None), stop is None,
                                  again != ids))
        return answers

    def probe(self):
        pass

    def stop(self):
        """Fails every request not yet answered (a batch on the GPU runs to
        its end, unread); later requests raise Stopped."""
        with self.lock:
            self.stopping = True
            waiting = list(self.waiting)
        for future in waiting:
            self._settle(future, error=Stopped())

    def close(self):
        self.requests.put(None)
        self.worker.join(timeout=5)
