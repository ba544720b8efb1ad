"""The `openai` backend: any OpenAI-compatible chat server (vllm serve, SGLang, llama.cpp).

In: base URL and API key (flags, or OPENAI_BASE_URL / OPENAI_API_KEY), a model name,
conversations, Sampling. Out: Completions with text, per-token logprobs when the server returns
them and, from vLLM (>= 0.10, asked with `return_token_ids`), token ids: the prompt as the
server rendered it and every sampled token, the stop token included, one logprob each. Ids are
kept only when they pair one to one with the logprobs; other servers send none, and their
records serve evaluation and envs (`train-grpo` skips them).
Logprobs: vLLM's are raw (before temperature) unless the server runs with `--logprobs-mode
processed_logprobs`, as `spade serve` starts it: then they are the sampled tokens' log-
probabilities after temperature, what the trainer recomputes (exactly so with top_p 1 and
top_k 0; with truncation vLLM renormalises over the kept tokens); greedy requests get
temperature-1 ones, as the trainer scores them. Decoding the ids gives the text, except where
the server rewrote the reply: a native tool call (below), a stop string ending inside a token
(the text ends with the stop string, the ids with that token), a reasoning parser (the thinking
leaves `content`): run vLLM without `--reasoning-parser`.
Guarantees: it streams (`submit`): each request runs on one of `concurrency` threads the
backend owns (`close()` ends them), on a kept-alive HTTP connection, and its Future resolves as
soon as its own reply is back; `chat` submits every conversation and collects. Each request
carries its own seed (none without per-request seeds: `Sampling.per_request_seed`). Native tool
calls in a reply are turned back into `<tool_call>{json}</tool_call>` text, so envs see the
same action format from every backend (the ids stay the sampled ones); a vLLM without a
tool-call parser (it refuses tools with `tool_choice` auto) is asked with `tool_choice` none
and returns the model's own call text. A server that refuses vLLM's extra fields is asked
without them. A server that cannot be reached raises BackendUnavailable (exit 69). Stdlib only.
A request past its conversation's deadline is cut (finish_reason `timeout`; closing the
connection makes vLLM abort it); a reply the server has not sent within $SPADE_REQUEST_TIMEOUT
seconds (default 600) is BackendUnavailable, the stage's exit 69, saying so; a server that refuses a prompt for its context length
(prompt + max_tokens: the server counts the tokens) gives finish_reason `context_limit`.
The server renders the chat template, so its special tokens are unknown here: `<|` (ChatML,
Llama 3, Phi) and `<｜` (DeepSeek) get a zero-width space in content and tools, so env text
cannot open a turn of those templates.
"""

from __future__ import annotations

import http.client
import json
import os
import queue
import re
import threading
import time
import urllib.parse
from concurrent.futures import Future

from stages.backends import (LOOP, BackendSpec, BackendUnavailable, Completion, Sampling,
                             escape_special_tokens, finish_reason)

SERVER_SPECIALS = ("<|", "<\uff5c")
# how vLLM, SGLang, llama.cpp and OpenAI word a prompt too long for the context (HTTP 400)
CONTEXT_REFUSAL = re.compile(r"context[ _](length|size|window)|maximum context", re.IGNORECASE)
# What a server's refusal (HTTP 400) of a request says -> the change of every later request
# that avoids it: a server that does not know vLLM's fields for trainable records goes without
# them; a vLLM without a tool-call parser gets `tool_choice: "none"`, so it renders the tools
# and returns the model's own call text (`<tool_call>...` for Qwen) as content.
FALLBACKS = {"no_vllm_fields": re.compile(
                 r"return_token_ids|include_stop_str_in_output|repetition_detection"),
             "tool_calls_as_text": re.compile(r"tool choice requires")}
# Seconds one request waits for its whole reply (the server sends nothing before it is done).
# 600 s holds thousands of tokens on a GPU; a CPU server with several requests at once makes
# tens of tokens a second in all, so a 3,000-token design needs more: the variable says so.
TIMEOUT_ENV = "SPADE_REQUEST_TIMEOUT"
DEFAULT_TIMEOUT = 600.0
# a kept-alive connection the server closed while idle fails like this on its next request
STALE_CONNECTION = (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError)


def request_timeout(option: float | str | None) -> float:
    """The reply timeout: the backend option, else $SPADE_REQUEST_TIMEOUT, else 600 s."""
    value = option if option is not None else os.environ.get(TIMEOUT_ENV) or DEFAULT_TIMEOUT
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not 0 < seconds < float("inf"):
        raise BackendUnavailable(f"{TIMEOUT_ENV}={value!r}: expected seconds above 0")
    return seconds


class BadRequest(Exception):
    """HTTP 400: the server refused this request (its message in `detail`)."""

    def __init__(self, message: str, detail: str):
        super().__init__(message)
        self.detail = detail


class RequestThreads:
    """Up to `size` threads, started as requests need them, each running requests one after
    another on its own kept-alive connection. Daemon threads, unlike ThreadPoolExecutor's: the
    interpreter never waits at exit for a request still in flight, so Ctrl-C during a long
    generation ends the process at once (the server drops the request)."""

    def __init__(self, size: int):
        self.size = size
        self.threads: list[threading.Thread] = []
        self.idle = 0  # threads waiting for work and not yet claimed by a submit
        self.lock = threading.Lock()
        self.work: queue.SimpleQueue = queue.SimpleQueue()

    def submit(self, fn, *args) -> Future:
        future: Future = Future()
        self.work.put((future, fn, args))
        with self.lock:
            if self.idle:
                self.idle -= 1
            elif len(self.threads) < self.size:
                thread = threading.Thread(target=self._run, daemon=True,
                                          name=f"openai-{len(self.threads) + 1}")
                self.threads.append(thread)
                thread.start()
        return future

    def close(self) -> None:
        """Cancel what has not started, and wait for the requests running to end."""
        with self.lock:
            threads, self.threads, self.idle = self.threads, [], 0
        while True:
            try:
                item = self.work.get_nowait()
            except queue.Empty:
                break
            if item is not None:
                item[0].cancel()
        for _ in threads:
            self.work.put(None)
        for thread in threads:
            thread.join()

    def _run(self) -> None:
        while (item := self.work.get()) is not None:
            future, fn, args = item
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn(*args))
                except BaseException as exc:  # the caller's future carries it
                    future.set_exception(exc)
            with self.lock:
                self.idle += 1


class OpenAIBackend:
    name = "openai"

    def __init__(self, spec: BackendSpec):
        self.base_url = (spec.base_url or os.environ.get("OPENAI_BASE_URL")
                         or "http://127.0.0.1:8000/v1").rstrip("/")
        self.api_key = spec.api_key or os.environ.get("OPENAI_API_KEY") or "EMPTY"
        self.model = spec.model
        self.policy = spec.options.get("policy") or f"{self.base_url}#{spec.model}"
        # requests in flight at most: the engine queues and batches them, and callers bound
        # them (rollout's --concurrency plays, a stage's conversations). 1024 is what vLLM
        # schedules at once on an H100-class GPU (its max_num_seqs there): never the limit.
        self.concurrency = int(spec.options.get("concurrency", 1024))
        self.timeout = request_timeout(spec.options.get("timeout"))
        url = urllib.parse.urlsplit(self.base_url)
        self._connection_class = (http.client.HTTPSConnection if url.scheme == "https"
                                  else http.client.HTTPConnection)
        self._host, self._path = url.netloc, url.path
        self._fallbacks: set[str] = set()  # FALLBACKS this server needed
        self._threads = RequestThreads(self.concurrency)
        self._local = threading.local()  # each thread's kept-alive connection

    def chat(self, conversations, sampling: Sampling, tools=None) -> list[Completion]:
        tools = tools or [None] * len(conversations)
        futures = [self.submit(messages, sampling.one(index), tool_list)
                   for index, (messages, tool_list) in enumerate(zip(conversations, tools))]
        try:
            return [future.result() for future in futures]
        finally:
            for future in futures:  # after a failure, don't send what has not started
                future.cancel()

    def submit(self, messages, sampling: Sampling, tools=None) -> Future[Completion]:
        return self._threads.submit(self._one, messages, tools, sampling)

    def close(self) -> None:
        """End the request threads (requests not started are cancelled)."""
        self._threads.close()

    def _one(self, messages, tools, sampling: Sampling) -> Completion:
        deadline, timeout = sampling.deadline(0), self.timeout
        if deadline is not None:
            timeout = min(timeout, deadline - time.monotonic())
            if timeout <= 0:
                return Completion("", finish_reason="timeout")
        fallbacks = frozenset(self._fallbacks)
        try:
            reply = self._post("/chat/completions",
                               self._body(messages, tools, sampling, fallbacks), timeout)
        except BadRequest as refusal:
            if CONTEXT_REFUSAL.search(refusal.detail):
                return Completion("", finish_reason="context_limit")
            fallback = next((name for name, says in FALLBACKS.items()
                             if name not in fallbacks and says.search(refusal.detail)), None)
            if fallback is None:
                raise BackendUnavailable(str(refusal)) from None
            self._fallbacks.add(fallback)  # each one once: this recursion is bounded
            return self._one(messages, tools, sampling)
        except TimeoutError:
            if timeout < self.timeout:  # the deadline, not the server, ran out
                return Completion("", finish_reason="timeout")
            raise BackendUnavailable(f"{self.base_url}: no reply within {self.timeout:g} s "
                                     f"(a slower server needs {TIMEOUT_ENV}=SECONDS)") from None
        return completion(reply)

    def _body(self, messages, tools, sampling: Sampling, fallbacks: frozenset[str]) -> dict:
        body = {"model": self.model, "messages": escape_special_tokens(messages, SERVER_SPECIALS),
                "temperature": sampling.temperature, "top_p": sampling.top_p,
                "max_tokens": sampling.max_tokens, "logprobs": True}
        if "no_vllm_fields" not in fallbacks:
            body["return_token_ids"] = True
            if sampling.stop:  # the ids hold the stop string's tokens: so must the text
                body["include_stop_str_in_output"] = True
            if sampling.stop_loops:
                body["repetition_detection"] = LOOP
        if sampling.engine_seed is not None:
            body["seed"] = sampling.engine_seed
        if sampling.stop:
            body["stop"] = list(sampling.stop)
        if sampling.top_k:
            body["top_k"] = sampling.top_k  # vLLM and SGLang accept it as an extra parameter
        if sampling.enable_thinking is not None:  # vLLM's and SGLang's chat-template switch
            body["chat_template_kwargs"] = {"enable_thinking": sampling.enable_thinking}
        if tools:
            body["tools"] = escape_special_tokens(tools, SERVER_SPECIALS)
            if "tool_calls_as_text" in fallbacks:
                body["tool_choice"] = "none"
        return body

    def _post(self, path: str, body: dict, timeout: float) -> dict:
        where = f"{self.base_url}{path}"
        try:
            status, data = self._exchange(self._path + path, json.dumps(body).encode(), timeout)
        except TimeoutError:
            raise
        except (OSError, http.client.HTTPException) as exc:
            raise BackendUnavailable(f"{where}: cannot reach the server "
                                     f"({exc or type(exc).__name__})") from None
        if status != 200:
            detail = data.decode(errors="replace")[:300]
            if status == 400:
                raise BadRequest(f"{where}: HTTP 400: {detail}", detail)
            raise BackendUnavailable(f"{where}: HTTP {status}: {detail}")
        try:
            return json.loads(data)
        except ValueError as exc:
            raise BackendUnavailable(f"{where}: the reply is not JSON ({exc})") from None

    def _exchange(self, path: str, payload: bytes, timeout: float) -> tuple[int, bytes]:
        """POST on this thread's kept-alive connection: (status, body). A kept-alive connection
        the server closed while idle fails at once: the request goes again on a new one."""
        reused = getattr(self._local, "connection", None) is not None
        try:
            return self._send(path, payload, timeout)
        except STALE_CONNECTION:
            if not reused:
                raise
            return self._send(path, payload, timeout)

    def _send(self, path: str, payload: bytes, timeout: float) -> tuple[int, bytes]:
        connection = getattr(self._local, "connection", None)
        if connection is None:
            connection = self._local.connection = self._connection_class(self._host)
        connection.timeout = timeout
        if connection.sock is not None:
            connection.sock.settimeout(timeout)
        headers = {"Content-Type": "application/json", "Authorization": f"Bearer {self.api_key}"}
        try:
            connection.request("POST", path, payload, headers)
            response = connection.getresponse()
            data = response.read()
        except BaseException:
            self._drop_connection()  # broken, or cut at a deadline: closing makes vLLM abort it
            raise
        if response.will_close:
            self._drop_connection()
        return response.status, data

    def _drop_connection(self) -> None:
        connection = getattr(self._local, "connection", None)
        self._local.connection = None
        if connection is not None:
            connection.close()


def completion(reply: dict) -> Completion:
    """A chat-completion reply as a Completion: tool calls back as text, ids when they pair."""
    choice = reply["choices"][0]
    message = choice.get("message") or {}
    text = message.get("content") or ""
    for call in message.get("tool_calls") or []:
        function = call.get("function", {})
        arguments = function.get("arguments") or "{}"
        if isinstance(arguments, str):  # some servers send an object, most a JSON string
            try:
                arguments = json.loads(arguments)
            except ValueError:
                pass  # malformed arguments reach the env as text, which reports the error
        text += "<tool_call>" + json.dumps({"name": function.get("name"),
                                            "arguments": arguments}) + "</tool_call>"
    content = (choice.get("logprobs") or {}).get("content") or []
    logprobs = [float(item["logprob"]) for item in content] or None
    prompt_ids, completion_ids = reply.get("prompt_token_ids"), choice.get("token_ids")
    if not (prompt_ids and completion_ids and logprobs and len(completion_ids) == len(logprobs)):
        prompt_ids = completion_ids = None  # not trainable: no ids, or ids without logprobs
    return Completion(text, prompt_ids, completion_ids, logprobs,
                      finish_reason(choice.get("finish_reason")))
