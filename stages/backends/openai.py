"""The `openai` backend: any OpenAI-compatible chat server (vllm serve, SGLang, llama.cpp).

In: base URL and API key (flags, or OPENAI_BASE_URL / OPENAI_API_KEY), a model name,
conversations, Sampling. Out: Completions with text and per-token logprobs when the server
returns them. Token ids are NOT available through the standard API, so `prompt_ids` and
`completion_ids` are None: records from this backend are fine for evaluation and for envs, but
`train-grpo` needs a backend that keeps ids (hf, vllm).
Logprobs: vLLM returns raw (pre-temperature) logprobs unless the server runs with
`--logprobs-mode processed_logprobs`; start it that way when these records feed training.
Guarantees: native tool calls in the reply are turned back into `<tool_call>{json}</tool_call>`
text, so envs see the same action format from every backend; requests run concurrently; a
server that cannot be reached raises BackendUnavailable (exit 69). Stdlib only (urllib).
A request past its conversation's deadline is cut (finish_reason `timeout`); a server that
refuses a prompt for its context length (prompt + max_tokens: the server counts the tokens)
gives finish_reason `context_limit`. The server renders the chat template, so its special
tokens are unknown here: `<|` (ChatML, Llama 3, Phi) and `<｜` (DeepSeek) get a zero-width
space in content and tools, so env text cannot open a turn of those templates.
"""

from __future__ import annotations

import json
import os
import re
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

from stages.backends import (BackendSpec, BackendUnavailable, Completion, Sampling,
                             escape_special_tokens)

SERVER_SPECIALS = ("<|", "<\uff5c")
# how vLLM, SGLang, llama.cpp and OpenAI word a prompt too long for the context (HTTP 400)
CONTEXT_REFUSAL = re.compile(r"context[ _](length|size|window)|maximum context", re.IGNORECASE)


class ContextRefused(Exception):
    """The server refused the prompt: prompt + max_tokens exceed its context."""


class OpenAIBackend:
    name = "openai"

    def __init__(self, spec: BackendSpec):
        self.base_url = (spec.base_url or os.environ.get("OPENAI_BASE_URL")
                         or "http://127.0.0.1:8000/v1").rstrip("/")
        self.api_key = spec.api_key or os.environ.get("OPENAI_API_KEY") or "EMPTY"
        self.model = spec.model
        self.policy = spec.options.get("policy") or f"{self.base_url}#{spec.model}"
        self.concurrency = int(spec.options.get("concurrency", 8))
        self.timeout = float(spec.options.get("timeout", 600))

    def chat(self, conversations, sampling: Sampling, tools=None) -> list[Completion]:
        tools = tools or [None] * len(conversations)

        def one(index: int) -> Completion:
            # a seed per request: one shared seed would give identical prompts identical samples
            seed = None if sampling.seed is None else sampling.seed + index
            return self._one(conversations[index], tools[index],
                             Sampling(**{**sampling.__dict__, "seed": seed,
                                         "deadlines": (sampling.deadline(index),)}))

        with ThreadPoolExecutor(max_workers=self.concurrency) as pool:
            return list(pool.map(one, range(len(conversations))))

    def _one(self, messages, tools, sampling: Sampling) -> Completion:
        deadline, timeout = sampling.deadline(0), self.timeout
        if deadline is not None:
            timeout = min(timeout, deadline - time.monotonic())
            if timeout <= 0:
                return Completion("", finish_reason="timeout")
        messages = escape_special_tokens(messages, SERVER_SPECIALS)
        tools = escape_special_tokens(tools, SERVER_SPECIALS)
        body = {"model": self.model, "messages": messages, "temperature": sampling.temperature,
                "top_p": sampling.top_p, "max_tokens": sampling.max_tokens, "logprobs": True}
        if sampling.seed is not None:
            body["seed"] = sampling.seed
        if sampling.stop:
            body["stop"] = list(sampling.stop)
        if sampling.top_k:
            body["top_k"] = sampling.top_k  # vLLM and SGLang accept it as an extra parameter
        if sampling.enable_thinking is not None:  # vLLM's and SGLang's chat-template switch
            body["chat_template_kwargs"] = {"enable_thinking": sampling.enable_thinking}
        if tools:
            body["tools"] = tools
        try:
            reply = self._post("/chat/completions", body, timeout)
        except ContextRefused:
            return Completion("", finish_reason="context_limit")
        except TimeoutError:
            if timeout < self.timeout:  # the deadline, not the server, ran out
                return Completion("", finish_reason="timeout")
            raise BackendUnavailable(f"{self.base_url}: no reply within {self.timeout:g} s "
                                     "(the `timeout` option)") from None
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
        finish = "length" if choice.get("finish_reason") == "length" else "stop"
        return Completion(text, None, None, logprobs, finish)

    def _post(self, path: str, body: dict, timeout: float) -> dict:
        request = urllib.request.Request(
            self.base_url + path, data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json",
                     "Authorization": f"Bearer {self.api_key}"})
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")[:300]
            if exc.code == 400 and CONTEXT_REFUSAL.search(detail):
                raise ContextRefused(detail) from None
            raise BackendUnavailable(f"{self.base_url}{path}: HTTP {exc.code}: {detail}") from None
        except TimeoutError:
            raise
        except urllib.error.URLError as exc:
            if isinstance(exc.reason, TimeoutError):
                raise TimeoutError(str(exc.reason)) from None
            raise BackendUnavailable(f"{self.base_url}{path}: cannot reach the server "
                                     f"({exc.reason})") from None
        except OSError as exc:
            raise BackendUnavailable(f"{self.base_url}{path}: cannot reach the server "
                                     f"({getattr(exc, 'reason', exc)})") from None
        except ValueError as exc:
            raise BackendUnavailable(f"{self.base_url}{path}: the reply is not JSON ({exc})") from None
