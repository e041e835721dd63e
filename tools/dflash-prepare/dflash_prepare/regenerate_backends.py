"""Where `dflash-prepare regenerate` gets the target's answers.

- ServerBackend: an OpenAI-compatible chat-completions server (vLLM,
  SGLang) over HTTP, with the standard library only. Timeouts, dropped
  connections, 429 and 5xx answers are retried with exponential backoff;
  other 4xx answers and malformed answers fail the request at once.
- TransformersBackend: greedy (or sampled) `generate` of a local Hugging
  Face target; requests from many threads are batched on one GPU thread.

Both answer `complete(messages, tools)` with an Answer or raise
RequestFailed, and are safe to call from several threads.
"""
import concurrent.futures
import http.client
import json
import queue
import random
import socket
import threading
import time
import urllib.error
import urllib.request

from .errors import UserError, require, require_torch2


class RequestFailed(Exception):
    """A conversation's request failed for good (after any retries)."""


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


def parse_answer(payload):
    """An Answer from a chat-completions response body, or RequestFailed
    saying what is wrong with it."""
    try:
        body = json.loads(payload)
    except ValueError:
        raise RequestFailed("malformed answer: the body is not json "
                            f"({payload[:60]!r})") from None
    except RecursionError:
        raise RequestFailed("malformed answer: the body nests deeper than python's "
                            "json reader follows") from None
    choices = body.get("choices") if isinstance(body, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise RequestFailed("malformed answer: no choices[0]")
    message = choices[0].get("message")
    if not isinstance(message, dict):
        raise RequestFailed("malformed answer: choices[0] has no message object")
    content = message.get("content")
    calls = message.get("tool_calls") or None
    if content is not None and not isinstance(content, str):
        raise RequestFailed(f"malformed answer: content is a {type(content).__name__}")
    if calls is not None and not isinstance(calls, list):
        raise RequestFailed("malformed answer: tool_calls is not a list")
    if content is None and not calls:
        raise RequestFailed("malformed answer: neither content nor tool_calls")
    # vLLM and SGLang name the parsed reasoning either way.
    reasoning = message.get("reasoning_content", message.get("reasoning"))
    if reasoning is not None and not isinstance(reasoning, str):
        raise RequestFailed("malformed answer: reasoning_content is not a string")
    try:
        # JSON may escape a lone surrogate ("\udc00"), which no UTF-8 output
        # can hold: the answer's failure, not the run's.
        json.dumps([content, reasoning, calls], ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise RequestFailed("malformed answer: a lone surrogate escape in its text "
                            "(not a unicode character)") from None
    except (RecursionError, ValueError):
        raise RequestFailed("malformed answer: tool_calls nest too deep") from None
    usage = body.get("usage") if isinstance(body.get("usage"), dict) else {}
    tokens = usage.get("completion_tokens")
    return Answer(content, reasoning or None, calls,
                  tokens if isinstance(tokens, int) and tokens >= 0 else 0,
                  choices[0].get("finish_reason") == "length")


class ServerBackend:
    def __init__(self, url, model, timeout=600.0, retries=4, backoff=1.0,
                 temperature=0.0, top_p=1.0, max_tokens=2048, template_options=None):
        self.endpoint = chat_completions_url(url)
        self.model = model
        self.timeout = timeout
        self.retries = retries
        self.backoff = backoff
        self.sampling = {"temperature": temperature, "top_p": top_p,
                         "max_tokens": max_tokens}
        self.template_options = template_options or {}

    def _post(self, body):
        request = urllib.request.Request(
            self.endpoint, data=json.dumps(body).encode(), method="POST",
            headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                return response.status, response.read().decode("utf-8", "replace")
        except urllib.error.HTTPError as error:
            return error.code, error.read().decode("utf-8", "replace")

    def complete(self, messages, tools=None):
        body = dict(self.sampling, model=self.model, messages=messages)
        if tools:
            body["tools"] = tools
        if self.template_options:
            # vLLM's and SGLang's name for the chat template's options.
            body["chat_template_kwargs"] = self.template_options
        why = None
        for attempt in range(self.retries + 1):
            if attempt:
                delay = self.backoff * 2 ** (attempt - 1)
                time.sleep(delay * (0.5 + random.random()))
            try:
                status, payload = self._post(body)
            except (socket.timeout, TimeoutError):
                why = f"no answer within --timeout {self.timeout:g} s"
                continue
            except (ConnectionError, http.client.HTTPException, urllib.error.URLError,
                    OSError) as error:
                reason = getattr(error, "reason", None) or error
                why = f"connection failed ({type(reason).__name__}: {reason})"
                continue
            if status == 200:
                return parse_answer(payload)
            why = f"HTTP {status} ({payload.strip()[:80]!r})"
            if status != 429 and status < 500:
                raise RequestFailed(why)
        raise RequestFailed(f"{why}, after {self.retries + 1} attempts")

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
        self.worker = threading.Thread(target=self._serve, daemon=True)
        self.worker.start()

    def complete(self, messages, tools=None):
        try:
            prompt = self.tokenizer.apply_chat_template(
                messages, tools=tools, tokenize=False, add_generation_prompt=True,
                **self.template_options)
        except Exception as error:  # jinja2 errors, the template's raise_exception
            raise RequestFailed(f"the chat template failed: {error}") from None
        future = concurrent.futures.Future()
        self.requests.put((prompt, future))
        return future.result()

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
            try:
                answers = self._generate([prompt for prompt, _ in work])
            except Exception as error:  # a CUDA or generate error fails the batch
                for _, future in work:
                    future.set_exception(RequestFailed(f"generate failed: {error}"))
                continue
            for (_, future), answer in zip(work, answers):
                future.set_result(answer)

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

    def close(self):
        self.requests.put(None)
        self.worker.join(timeout=5)
