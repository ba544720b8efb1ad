"""One generation interface over several engines.

In: conversations (lists of chat messages), optional tool schemas per conversation, `Sampling`.
Out: one `Completion` per conversation: text, and where the engine can give them the rendered
`prompt_ids`, sampled `completion_ids` and per-token sampling `logprobs` (log-probabilities of
the sampled tokens under the temperature-scaled distribution, before top-p/top-k truncation).
Guarantees: a backend whose package or device is missing raises BackendUnavailable (exit 69)
with the install hint; decoding `completion_ids` (special tokens skipped) gives `text`; a
conversation whose prompt plus `max_tokens` exceeds the model's context is not generated
(finish_reason `context_limit`, empty text); generation past a conversation's deadline stops
(finish_reason `timeout`, the text so far) on every engine (hf, vllm, openai); with
`Sampling.stop_loops`, a generation caught in a loop (`LOOP`) stops there (finish_reason
`repetition`, the text so far) on every engine (openai: a vLLM server).

Message content and tool schemas never render as the tokenizer's special tokens: an env whose
observation holds `<|im_start|>system ...` must not forge a system or assistant turn. Before the
chat template runs, every special-token string in them gets a zero-width space (U+200B) after
its first character, so it tokenizes as ordinary text; only the template's own markup yields
special tokens. (Escaping, rather than tokenizing content spans apart, works with every
template, including ones that trim or inspect content, and keeps one rendering per prompt.)

Backends: `hf` (transformers, CPU or GPU), `vllm` (in-process vllm.LLM, GPU), `openai` (any
OpenAI-compatible server: no token ids), `scripted` (a Python callable; tests and benchmarks).
Every backend re-renders the whole conversation for every call, so a thinking template that
drops old <think> blocks yields per-turn prompt ids that are exactly what the model saw.
A LoRA checkpoint (stages/train/checkpoint.py: an adapter folder) is served as its base with the
adapter applied, never merged: hf through peft, vllm as a LoRA request on the base.
Seeds: a request gives the engine its seed (`Sampling.engine_seed`) unless `per_request_seed` is
off; then no engine gets one (hf draws from torch's own generator, vllm and openai send none).
"""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

Message = dict[str, Any]
# A loop: the last `size` tokens, for a size from min_pattern_size to max_pattern_size, are
# the same `size` tokens min_count times in a row (vLLM's RepetitionDetectionParams rule, so the
# hf engine stops where vLLM does). Measured on 283 designs of the 1.5B coder: it stops 26 of
# the 40 that ran to max-tokens (each a line or list item repeated to the end) and none of the
# 243 that ended on their own; one token repeated (size 1) would have cut 6 of those, at a long
# literal number (digits are tokens of their own).
LOOP = {"min_pattern_size": 2, "max_pattern_size": 100, "min_count": 20}
LOOP_SPAN = LOOP["max_pattern_size"] * LOOP["min_count"]  # the most tokens one loop check reads


class BackendUnavailable(RuntimeError):
    """The engine cannot run here (package not installed, no device): exit 69."""


@dataclass(frozen=True)
class Sampling:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_tokens: int = 256
    seed: int | None = None
    stop: tuple[str, ...] = ()
    # per conversation: the time.monotonic() by which its generation must end (empty: none)
    deadlines: tuple[float | None, ...] = ()
    # per conversation: its own sampling seed (empty: `seed + index`, or None without `seed`);
    # rollout derives them from (play, turn), so a play's samples do not depend on the schedule
    seeds: tuple[int | None, ...] = ()
    # passed to the chat template as `enable_thinking` (Qwen3's switch); None: the template's
    # own default
    enable_thinking: bool | None = None
    # whether each request hands its seed to the engine (`engine_seed`): reproducible samples,
    # independent of batching. False: the engine samples from its own generator state, which is
    # faster where vLLM's V1 sampler loops over seeded requests (benchmarks/sampler.py, docs/gpu.md)
    per_request_seed: bool = True
    # stop a generation caught in a loop (LOOP): finish_reason "repetition"
    stop_loops: bool = False

    @property
    def engine_seed(self) -> int | None:
        """The seed this request gives the engine: `seed`, or None without per-request seeds."""
        return self.seed if self.per_request_seed else None

    def deadline(self, index: int) -> float | None:
        return self.deadlines[index] if self.deadlines else None

    def seed_for(self, index: int) -> int | None:
        if self.seeds:
            return self.seeds[index]
        return None if self.seed is None else self.seed + index

    def per_item(self, *keys: Any) -> "Sampling":
        """One seed per conversation, from `seed` and that conversation's key (an env id, ...):
        its sample then does not depend on which call or position it had."""
        if self.seed is None:
            return self
        from stages.records import derive_seed

        return replace(self, seeds=tuple(derive_seed(self.seed, key) for key in keys))

    def one(self, index: int) -> "Sampling":
        """The settings of conversation `index` alone: its seed and deadline."""
        return replace(self, seed=self.seed_for(index), seeds=(),
                       deadlines=(self.deadline(index),) if self.deadlines else ())


@dataclass
class Completion:
    text: str
    prompt_ids: list[int] | None = None
    completion_ids: list[int] | None = None
    logprobs: list[float] | None = None
    # "stop" (end of turn or a stop string), "length" (max_tokens), "timeout" (the deadline
    # passed), "context_limit" (prompt + max_tokens exceed the model's context: not generated),
    # "repetition" (a loop, with Sampling.stop_loops)
    finish_reason: str = "stop"
    meta: dict[str, Any] = field(default_factory=dict)


class Backend(Protocol):
    name: str
    policy: str  # what produced the samples: recorded as `policy` on every record

    def chat(self, conversations: list[list[Message]], sampling: Sampling,
             tools: list[list[dict] | None] | None = None) -> list[Completion]: ...

    def close(self) -> None:
        """Free what the backend holds (an engine, its memory and its GPU share): the next
        stage of a `spade run`, in the same process, may load its own."""


class Streaming(Backend, Protocol):
    """A backend that takes conversations one at a time and answers each as soon as it is done
    (the engine batches continuously): rollout then runs without a turn barrier.
    `sampling` is the request's own (`Sampling.one`): `seed` is used as it is."""

    def submit(self, messages: list[Message], sampling: Sampling,
               tools: list[dict] | None = None) -> Future[Completion]: ...


def finish_reason(engine_reason: str | None) -> str:
    """An engine's finish reason (vLLM's, a server's) as a Completion's: a stop string, the end
    of turn and anything unnamed are "stop"."""
    return engine_reason if engine_reason in ("length", "repetition") else "stop"


def ends_in_loop(ids: list[int]) -> bool:
    """Whether `ids` end in a loop (LOOP)."""
    repeats = LOOP["min_count"]
    for size in range(LOOP["min_pattern_size"], LOOP["max_pattern_size"] + 1):
        if size * repeats > len(ids):
            return False
        tail = ids[-size:]
        if all(ids[-size * (k + 1):len(ids) - size * k] == tail for k in range(1, repeats)):
            return True
    return False


def streams(backend: Backend) -> bool:
    return callable(getattr(backend, "submit", None))


@dataclass(frozen=True)
class BackendSpec:
    """How to build a backend; the CLI fills it from --backend/--model/--base-url flags."""

    name: str = "hf"
    model: str = ""
    base_url: str | None = None
    api_key: str | None = None
    device: str | None = None
    dtype: str | None = None
    options: dict[str, Any] = field(default_factory=dict)


def check_local_model(model: str) -> None:
    """A path that is not a directory is an error, unless it looks like a hub id `org/name`;
    so is a LoRA checkpoint (an adapter folder) whose base model is.

    Nothing may reach a hub unless the user names a hub model on purpose."""
    import os

    if os.path.isdir(model):
        from stages.train import adapter_base

        base = adapter_base(model)
        if base is None or os.path.isdir(base) or looks_like_hub_id(base):
            return
        from stages.shards import InputMissing

        raise InputMissing(f"{model}: a LoRA adapter on {base}, which is no model directory "
                           f"(an adapter needs the base it was trained on)")
    if not looks_like_hub_id(model):
        from stages.shards import InputMissing

        raise InputMissing(f"{model}: no such model directory (a hub model is named org/name)")


MODEL_FILES = ("config.json", "adapter_config.json")  # a whole model, a LoRA checkpoint
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "spiece.model",
                   "tiktoken.model", "qwen.tiktoken")


def check_model_dir(model: str) -> None:
    """A directory given as a model must hold one (config.json, or a LoRA checkpoint's
    adapter_config.json): else InputMissing (exit 66) in one line, before anything loads it,
    naming the newest checkpoint inside when it holds `step-*` checkpoints (`-m RUN/ckpt`)."""
    import os
    from pathlib import Path

    folder = Path(model)
    if any((folder / name).is_file() for name in MODEL_FILES):
        return
    from stages.shards import InputMissing

    steps = sorted(p for p in folder.glob("step-*")
                   if any((p / name).is_file() for name in MODEL_FILES))
    if steps:
        raise InputMissing(f"{model}: not a model directory (no config.json): it holds "
                           f"checkpoints, the newest is {os.path.join(model, steps[-1].name)}")
    raise InputMissing(f"{model}: not a model directory (no config.json; `spade model tiny "
                       f"DIR` builds one offline)")


def check_model_files(model: str) -> None:
    """Before a local model directory is loaded (by a backend, train-grpo, or `spade run` for
    its `[model] init`): it holds a model and its tokenizer, else InputMissing (exit 66) in one
    line (transformers would end a long traceback with a hint to install sentencepiece).
    Nothing to check for a hub id."""
    import os
    from pathlib import Path

    if not os.path.isdir(model):
        return
    check_model_dir(model)
    if any((Path(model) / name).is_file() for name in TOKENIZER_FILES):
        return
    from stages.shards import InputMissing

    raise InputMissing(f"{model}: no tokenizer files beside config.json "
                       f"({', '.join(TOKENIZER_FILES[:3])}): a model directory needs its "
                       f"tokenizer (save it with tokenizer.save_pretrained(DIR))")


def looks_like_hub_id(model: str) -> bool:
    return model.count("/") == 1 and not model.startswith((".", "/", "~"))


def load_backend(spec: BackendSpec) -> Backend:
    if spec.name == "hf":
        from stages.backends.hf import HFBackend

        return HFBackend(spec)
    if spec.name == "vllm":
        from stages.backends.vllm import VLLMBackend

        return VLLMBackend(spec)
    if spec.name == "openai":
        from stages.backends.openai import OpenAIBackend

        return OpenAIBackend(spec)
    raise BackendUnavailable(f"unknown backend {spec.name!r}: choose hf, vllm or openai")


def render_prompt(tokenizer, messages: list[Message], tools: list[dict] | None,
                  enable_thinking: bool | None = None) -> list[int]:
    """Token ids of the conversation under the model's chat template, ready for generation.

    Templates that render `tools` get them natively; others get them in the system turn.
    Content and tools are escaped first (`escape_special_tokens`). `enable_thinking` reaches
    the template only when set, so None leaves the template's own default."""
    specials = special_token_strings(tokenizer)
    messages = [{**m, "content": escape_special_tokens(m["content"], specials)}
                if isinstance(m.get("content"), str) else m for m in messages]
    tools = escape_special_tokens(tools, specials) if tools else None
    if tools and "tools" not in (tokenizer.chat_template or ""):
        messages, tools = tools_in_system_prompt(messages, tools), None
    switch = {} if enable_thinking is None else {"enable_thinking": enable_thinking}
    return list(tokenizer.apply_chat_template(messages, tools=tools or None,
                                              add_generation_prompt=True, tokenize=True,
                                              return_dict=False, **switch))


def special_token_strings(tokenizer) -> tuple[str, ...]:
    """The tokenizer's special tokens that could be forged in text (two characters or more)."""
    return tuple(token.content for token in tokenizer.added_tokens_decoder.values()
                 if token.special and len(token.content) > 1)


ZERO_WIDTH_SPACE = "\u200b"


def escape_special_tokens(value: Any, specials: tuple[str, ...]) -> Any:
    """`value` (a string, or lists and dicts of them) with a zero-width space after the first
    character of every special-token string, so none of them tokenizes as the special token."""
    if isinstance(value, str):
        for token in specials:
            if token in value:
                value = value.replace(token, token[0] + ZERO_WIDTH_SPACE + token[1:])
        return value
    if isinstance(value, list):
        return [escape_special_tokens(item, specials) for item in value]
    if isinstance(value, dict):
        return {key: escape_special_tokens(item, specials) for key, item in value.items()}
    return value


def unfit_completion(prompt: list[int], sampling: Sampling, context_length: int,
                     deadline: float | None, now: float) -> Completion | None:
    """The Completion of a conversation that must not be generated, or None when it may be:
    `context_limit` when prompt + max_tokens exceed the context, `timeout` past its deadline."""
    if len(prompt) + sampling.max_tokens > context_length:
        return Completion("", prompt, [], [], "context_limit")
    if deadline is not None and now >= deadline:
        return Completion("", prompt, [], [], "timeout")
    return None


def tools_in_system_prompt(messages: list[Message], tools: list[dict] | None) -> list[Message]:
    """For chat templates without native tool support: describe the tools in the system turn."""
    if not tools:
        return messages
    import json

    listing = "\n".join(json.dumps(tool["function"] if "function" in tool else tool)
                        for tool in tools)
    note = ("You can call these tools. To call one, write "
            '<tool_call>{"name": "...", "arguments": {...}}</tool_call>.\n' + listing)
    if messages and messages[0]["role"] == "system":
        return [{**messages[0], "content": messages[0]["content"] + "\n\n" + note}, *messages[1:]]
    return [{"role": "system", "content": note}, *messages]
