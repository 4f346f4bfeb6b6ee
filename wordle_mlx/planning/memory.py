"""Peak-memory arithmetic for one SFT or GRPO step: pure functions of model dimensions and config numbers.

`ModelDims` holds what memory depends on (hidden size, layers, heads, KV heads, head size, MLP width,
vocabulary, Gemma 3's sliding window and pattern, bytes per value, quantization bits and group size).
`sft_plan` and `grpo_plan` return a `MemoryPlan`: itemised bytes whose sum is the expected peak of MLX's
allocator (`mx.get_peak_memory()`) during one step:
- weights: the text model's parameters at their dtype, or at `bits` per value plus a scale and a bias per
  group of `group_size` (mlx-lm's affine quantization; norms stay in the float dtype). mlx-lm drops the
  vision tower of Gemma 3's multimodal checkpoints when it loads them, so it costs nothing here;
- LoRA: rank x (in + out) per adapted linear, float32, times (weights + gradients + optimizer states);
- KV cache (GRPO rollouts, mlx-lm's `BatchGenerator`): tokens x KV heads x head size x 2 (keys, values) x bytes
  per layer, a sliding-window layer never holding more than its window. Each distinct prompt (B, plus the prefix
  all prompts share) is prefilled once into a cache of its own, allocated in steps of 256 tokens. The decoding
  batch copies those into one cache of rows x the prompt's length, which the first decoded token grows by 256
  (the step) and every further 256 reply tokens by 256 more (KV_BATCH_COPIES = 1 copy of it). Measured on the
  270M at 40 rows (the shipped adapter's replies, rows leaving the batch in the order they entered it): the
  peak was that one copy, the prompt caches and the sampling logits. A transient second copy can add to it:
  with a base model whose rows stopped at scattered steps, mlx-lm's re-gathering of the rows that stay briefly
  held 31 rows' copy beside the 40 rows' cache (1.7x the batch cache); the plan does not count that case;
- sampling logits (GRPO rollouts): per decoding row, DECODE_LOGIT_COPIES vocabulary-wide arrays in the model
  dtype (this step's logits and log-softmax, and the previous step's log-softmax, which mlx-lm's pipelined
  decoding keeps while the next step runs) plus one in float32 (our stacked log-probs or the sampler's copy);
  measured on the 270M in float32: about 3.6 MB per row, against 4 x 1 MB counted;
- activations: what the backward pass keeps per token and layer (ACTIVATION_VALUES_PER_TOKEN below), all
  layers without gradient checkpointing, with it the layer inputs plus one layer recomputed;
- logits: the loss positions of a micro-batch x vocabulary, in the model dtype then float32 with its
  gradient and softmax (LOGIT_COPIES_FLOAT32); on the CPU a vocabulary-wide SFT loss keeps its softmax in numpy
  (`llm/model/cpu_kernels.cross_entropy`), so MLX holds the float32 logits and their gradient only.
GRPO's peak is the larger of its rollout phase (prompt caches, the batch's KV cache and sampling logits, all
growing with the decoded rows B x G, and with the prompt and reply lengths) and its update phase (activations and
loss logits of one micro-batch); both hold the weights and the LoRA state. The constants are structural
counts of the arrays kept alive, checked against measured peaks by `benchmarks/memory_plan.py`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

GB = 1024 ** 3
MAC_SIZES_GB = (8, 16, 24, 32, 36, 48, 64, 96, 128)
# the share of unified memory Metal recommends as a working set (`max_recommended_working_set_size`, which the
# planner reads on the Mac it runs on): about two thirds on Macs of 32 GB and less (10.7 of 16 GB), three
# quarters on larger ones; these stand in for it offline (`--memory-gb`, the "fits Macs of" list)
SMALL_MAC_GB = 32
SMALL_MAC_FRACTION = 2 / 3
LARGE_MAC_FRACTION = 0.75
WORKING_SET_RULE = "a working set of two thirds of memory up to 32 GB, three quarters above"
KV_STEP = 256                     # mlx-lm's KVCache / RotatingKVCache grow in steps of this many tokens
LOGIT_COPIES_FLOAT32 = 3          # float32 logits, their softmax / log-softmax, and their gradient
NUMPY_LOGIT_COPIES = 1            # on the CPU the vocabulary-wide loss runs in numpy: MLX holds logits + gradient
KV_BATCH_COPIES = 1               # the decoding batch's cache (see the module docstring for a transient copy)
DECODE_LOGIT_COPIES = 3           # per decoding row: logits, log-softmax, the previous step's (model dtype)
LETTER_ROWS = 26                  # grammar and words decoding project onto the 26 letter rows only
DEFAULT_LORA_KEYS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                     "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")


@dataclass(frozen=True)
class ModelDims:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    sliding_window: int
    sliding_window_pattern: int
    value_bytes: int                 # bytes per float weight / activation: 4 float32, 2 bfloat16 / float16
    bits: int | None = None          # quantized linears and embedding (mlx-lm's affine quantization)
    group_size: int = 64

    def linear_shapes(self) -> dict[str, tuple[int, int]]:
        """(in, out) of each linear inside one transformer block, by mlx-lm's module name."""
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        return {"self_attn.q_proj": (self.hidden, q), "self_attn.k_proj": (self.hidden, kv),
                "self_attn.v_proj": (self.hidden, kv), "self_attn.o_proj": (q, self.hidden),
                "mlp.gate_proj": (self.hidden, self.intermediate), "mlp.up_proj": (self.hidden, self.intermediate),
                "mlp.down_proj": (self.intermediate, self.hidden)}

    def sliding_layers(self) -> int:
        return sum(1 for i in range(self.layers) if (i + 1) % self.sliding_window_pattern != 0)


@dataclass
class MemoryPlan:
    items: dict[str, int]            # bytes by part, in the order they are printed
    notes: dict[str, str] = field(default_factory=dict)   # the arithmetic behind each part

    @property
    def peak(self) -> int:
        return sum(self.items.values())


def text_parameters(d: ModelDims) -> tuple[int, int]:
    """(parameters in linears and the embedding, parameters in norms) of the text model (tied embedding)."""
    linear = d.vocab * d.hidden + d.layers * sum(i * o for i, o in d.linear_shapes().values())
    norms = d.layers * (4 * d.hidden + 2 * d.head_dim) + d.hidden
    return linear, norms


def weight_bytes(d: ModelDims) -> int:
    linear, norms = text_parameters(d)
    if d.bits is None:
        return (linear + norms) * d.value_bytes
    groups = linear // d.group_size
    return linear * d.bits // 8 + groups * 2 * d.value_bytes + norms * d.value_bytes


def lora_blocks(d: ModelDims, num_layers: int) -> int:
    """Blocks that carry LoRA: the last `num_layers` (-1: all)."""
    return d.layers if num_layers < 0 else min(num_layers, d.layers)


def lora_parameters(d: ModelDims, rank: int, num_layers: int, keys=None) -> int:
    """LoRA weights of the last `num_layers` blocks (-1: all), on `keys` (None: every linear of a block)."""
    shapes = d.linear_shapes()
    keys = DEFAULT_LORA_KEYS if keys is None else keys
    return lora_blocks(d, num_layers) * sum(rank * (shapes[k][0] + shapes[k][1]) for k in keys if k in shapes)


def lora_bytes(params: int, optimizer_states: int, gradients: int = 1, trained: int | None = None) -> int:
    """float32 LoRA weights (`params`), and for the `trained` ones (default: all) `gradients` gradient trees
    alive at once and the optimizer's states per weight."""
    trained = params if trained is None else trained
    return params * 4 + trained * 4 * (gradients + optimizer_states)


def trained_blocks(d: ModelDims, num_layers: int, train_layers: int | None) -> int:
    """Blocks whose LoRA trains (`train_layers`: the last few; None: every LoRA block); the backward pass
    stops below them."""
    blocks = lora_blocks(d, num_layers)
    return blocks if train_layers is None else min(train_layers, blocks)


def kv_cache_bytes(d: ModelDims, rows: int, tokens: int, allocated: int | None = None) -> int:
    """Keys and values of `rows` sequences of `tokens` tokens, in caches of `allocated` positions (default:
    `tokens` rounded up to KV_STEP, as a single sequence's cache grows); sliding layers hold at most the window."""
    allocated = math.ceil(tokens / KV_STEP) * KV_STEP if allocated is None else allocated
    sliding = d.sliding_layers()
    per_layer_tokens = sliding * min(allocated, d.sliding_window) + (d.layers - sliding) * allocated
    return rows * per_layer_tokens * d.kv_heads * d.head_dim * 2 * d.value_bytes


def batch_cache_width(prompt_tokens: int, reply_tokens: int) -> int:
    """Positions per row of the decoding batch's cache: the prompt, grown by KV_STEP at the first decoded token
    and every KV_STEP tokens after."""
    return prompt_tokens + KV_STEP * math.ceil(max(reply_tokens, 1) / KV_STEP)


def letter_decode_bytes(d: ModelDims, rows: int, distinct: int, prompt_tokens: int, batch: int) -> dict[str, int]:
    """Grammar / words decoding (`llm/play/letter_decoder.py`), which decodes `rows` replies in chunks of `batch`: the
    keys and values of the shared start and of each distinct prompt, exactly as long as they are, then each
    chunk row's own copy of its prompt's and letters' keys and values; the transient of a chunk's prefill (its
    prompts through one block: the MLP's gate, up and product and the attention scores in float32); 26-entry
    letter logits per row."""
    per_token = d.layers * d.kv_heads * d.head_dim * 2 * d.value_bytes
    chunk = min(rows, batch)
    prefill = min(chunk, max(distinct, 1))         # a chunk's distinct prompts (each chunk prefills its own)
    kv = (prefill + 1) * prompt_tokens * per_token + chunk * (prompt_tokens + 5) * per_token
    transient = prefill * prompt_tokens * (3 * d.intermediate * d.value_bytes + d.heads * prompt_tokens * 4)
    return {"kv_cache": kv, "logits": transient + chunk * LETTER_ROWS * 4}


def decode_logit_bytes(d: ModelDims, rows: int) -> int:
    """Vocabulary-wide arrays alive per decoding step of `rows` rows: DECODE_LOGIT_COPIES in the model dtype and
    one in float32."""
    return rows * d.vocab * (DECODE_LOGIT_COPIES * d.value_bytes + 4)


def activation_values_per_token(d: ModelDims, row_length: int) -> int:
    """Values one block keeps for its backward pass per token: 8 hidden-sized arrays (residuals, four norm
    outputs, attention and MLP outputs), queries / keys / values before and after their norm and rope, the
    attention output, 4 MLP-wide arrays (gate, up, GELU(gate), their product) and the attention
    probabilities with their scores (heads x row length)."""
    qkv = (d.heads + 2 * d.kv_heads) * d.head_dim
    return 8 * d.hidden + 2 * qkv + d.heads * d.head_dim + 4 * d.intermediate + 2 * d.heads * row_length


def activation_bytes(d: ModelDims, tokens: int, row_length: int, grad_checkpoint: bool,
                     layers: int | None = None) -> int:
    """Activations kept for the backward pass of one micro-batch of `tokens` tokens in rows of `row_length`,
    through the top `layers` blocks (default: all; the blocks below the trained ones keep nothing)."""
    layers = d.layers if layers is None else layers
    one_block = tokens * activation_values_per_token(d, row_length) * d.value_bytes
    if not grad_checkpoint:
        return layers * one_block
    return layers * tokens * d.hidden * d.value_bytes + one_block


def logit_bytes(d: ModelDims, positions: int, letters_only: bool = False, numpy_loss: bool = False) -> int:
    """Loss logits of `positions` positions for the backward pass: over the vocabulary, or over the 26 letter
    rows (grammar / words: the grammar loss and the GRPO update in those modes). `numpy_loss`: a vocabulary-wide
    SFT loss on the CPU (llm/model/cpu_kernels.cross_entropy), whose softmax lives in numpy, outside MLX."""
    copies = NUMPY_LOGIT_COPIES if numpy_loss and not letters_only else LOGIT_COPIES_FLOAT32
    return positions * (LETTER_ROWS if letters_only else d.vocab) * (d.value_bytes + 4 * copies)


def round_up(n: int, multiple: int) -> int:
    return max(multiple, -(-n // multiple) * multiple)


@dataclass(frozen=True)
class SFTNumbers:
    batch_size: int
    row_length: int                  # padded tokens per example (prompt + reply)
    reply_tokens: int                # target tokens per example
    pad_to: int
    rank: int
    num_layers: int
    keys: tuple | None
    grad_checkpoint: bool
    shared_prefix: int = 0           # tokens every example starts with, run once per batch (share_prefix)
    train_layers: int | None = None  # only the last few blocks' LoRA trains
    grammar_loss: bool = False       # the loss is over the 5 letters' 26 rows
    train_free: bool = False         # with grammar_loss: every reply token over the vocabulary too
    numpy_loss: bool = False         # the step runs on the CPU: vocabulary-wide losses in numpy (logit_bytes)


def sft_plan(d: ModelDims, n: SFTNumbers) -> MemoryPlan:
    lora = lora_parameters(d, n.rank, n.num_layers, n.keys)
    blocks = trained_blocks(d, n.num_layers, n.train_layers)
    trained = lora * blocks // max(lora_blocks(d, n.num_layers), 1)
    gradients = 1
    row = round_up(n.row_length - n.shared_prefix, n.pad_to)       # each example's own part, padded
    tokens = n.batch_size * row + n.shared_prefix
    positions = n.batch_size * 5 if n.grammar_loss else round_up(n.batch_size * n.reply_tokens, n.pad_to)
    tags = round_up(n.batch_size * n.reply_tokens, n.pad_to) if n.grammar_loss and n.train_free else 0
    plan = MemoryPlan({
        "weights": weight_bytes(d),
        "lora": lora_bytes(lora, 2, gradients, trained),
        "activations": activation_bytes(d, tokens, n.row_length, n.grad_checkpoint, blocks),
        "logits": logit_bytes(d, positions, n.grammar_loss, n.numpy_loss)
                  + (logit_bytes(d, tags, numpy_loss=n.numpy_loss) if tags else 0),
    })
    plan.notes = {
        "weights": weight_note(d),
        "lora": f"{lora:,} params x 4 B + {trained:,} trained x 4 B x ({gradients} grad + 2 AdamW states)",
        "activations": activation_note(d, tokens, n.row_length, n.grad_checkpoint,
                                       f"{n.batch_size} x {row} + {n.shared_prefix} shared", blocks),
        "logits": logit_note(d, positions, n.grammar_loss, n.numpy_loss)
                  + (f" + {logit_note(d, tags, False, n.numpy_loss)} (the whole reply)" if tags else ""),
    }
    return plan


def logit_note(d: ModelDims, positions: int, letters_only: bool, numpy_loss: bool = False) -> str:
    rows = f"{LETTER_ROWS} letter rows" if letters_only else f"{d.vocab:,}"
    numpy = numpy_loss and not letters_only
    copies = NUMPY_LOGIT_COPIES if numpy else LOGIT_COPIES_FLOAT32
    return (f"{positions} loss positions x {rows} x ({d.value_bytes} + 4 x {copies}) B"
            + (" (the CPU's numpy loss)" if numpy else ""))


@dataclass(frozen=True)
class GRPONumbers:
    batch_prompts: int
    generations: int                 # replies decoded per board: G samples and the greedy one
    prompt_tokens: int
    reply_tokens: int                # max_completion_tokens
    completion_batch_size: int
    max_tokens_per_microbatch: int
    max_loss_tokens_per_microbatch: int
    rank: int
    num_layers: int
    keys: tuple | None
    optimizer_states: int            # 2 AdamW, 1 SGD (mlx's SGD keeps a velocity per weight, momentum or not)
    grad_checkpoint: bool = False
    share_prompts: bool = False      # a group's replies go through one pass after their one prompt
    decode: str = "free"             # free: mlx-lm's BatchGenerator; grammar / words: the letter decoder
    train_layers: int | None = None  # only the last few blocks' LoRA trains


def grpo_rollout_bytes(d: ModelDims, n: GRPONumbers) -> dict[str, int]:
    """The rollout phase's arrays beside the weights and LoRA: {"kv_cache": ..., "logits": ...}."""
    rows = min(n.batch_prompts * n.generations, n.completion_batch_size)
    if n.decode != "free":
        return letter_decode_bytes(d, n.batch_prompts * n.generations, n.batch_prompts, n.prompt_tokens,
                                   n.completion_batch_size)
    width = batch_cache_width(n.prompt_tokens, n.reply_tokens)
    prompt_caches = kv_cache_bytes(d, n.batch_prompts + 1, n.prompt_tokens)
    batch_cache = KV_BATCH_COPIES * kv_cache_bytes(d, rows, width, allocated=width)
    return {"kv_cache": prompt_caches + batch_cache, "logits": decode_logit_bytes(d, rows)}


def grpo_plan(d: ModelDims, n: GRPONumbers) -> MemoryPlan:
    """Rollout: each prompt's own prefilled cache and the shared prefix's, the decoding batch's cache of
    min(B x G, completion_batch_size) rows (see the module docstring) and one step's
    sampling logits per row. Update: one micro-batch; with shared prompts a pass is as many whole groups (each
    prompt once, then its replies) as fit max_loss_tokens_per_microbatch and max_tokens_per_microbatch, else rows
    of prompt + reply up to max_tokens_per_microbatch."""
    lora = lora_parameters(d, n.rank, n.num_layers, n.keys)
    blocks = trained_blocks(d, n.num_layers, n.train_layers)
    trained = lora * blocks // max(lora_blocks(d, n.num_layers), 1)
    letters = n.decode != "free"
    rows = min(n.batch_prompts * n.generations, n.completion_batch_size)
    length = n.prompt_tokens + n.reply_tokens
    scored = 5 if letters else n.reply_tokens          # loss positions a reply: its 5 letters, or every token
    # a letter choice is a 26-wide logit row: in grammar and words decoding only the padded tokens bound a pass
    # (llm/training/rl.policy_batch); a vocabulary-wide row is capped at max_loss_tokens_per_microbatch
    loss_cap = n.max_tokens_per_microbatch if letters else n.max_loss_tokens_per_microbatch
    if n.share_prompts:
        # whole groups merged into one pass (llm/training/packing.merge_prompt_groups) while the loss tokens fit
        # max_loss_tokens_per_microbatch and the prompts and padded replies fit max_tokens_per_microbatch
        group = n.generations * scored
        prompts = max(1, min(n.batch_prompts, loss_cap // group,
                             n.max_tokens_per_microbatch // (n.prompt_tokens + n.generations * n.reply_tokens)))
        positions = min(loss_cap, prompts * group)
        tokens = prompts * n.prompt_tokens + positions
        shape = f"{prompts} prompt{'s' if prompts > 1 else ''} of {n.prompt_tokens} + {positions} reply"
    else:
        micro_rows = max(1, min(n.batch_prompts * n.generations * length, n.max_tokens_per_microbatch) // length)
        positions = min(loss_cap, micro_rows * scored)
        tokens, shape = micro_rows * length, f"{micro_rows} x {length}"
    width = batch_cache_width(n.prompt_tokens, n.reply_tokens)
    rollout = grpo_rollout_bytes(d, n)
    update = {"activations": activation_bytes(d, tokens, length, n.grad_checkpoint, blocks),
              "logits": logit_bytes(d, positions, letters)}
    phase = "rollout" if sum(rollout.values()) >= sum(update.values()) else "update"
    items = {"weights": weight_bytes(d), "lora": lora_bytes(lora, n.optimizer_states, trained=trained),
             **(rollout if phase == "rollout" else update)}
    allocated = math.ceil(n.prompt_tokens / KV_STEP) * KV_STEP
    sliding, full = d.sliding_layers(), d.layers - d.sliding_layers()

    def layer_tokens(held: int) -> str:
        return f"({sliding} sliding layers x {min(held, d.sliding_window)} + {full} global x {held})"

    notes = {
        "weights": weight_note(d),
        "lora": f"{lora:,} params x 4 B + {trained:,} trained x 4 B x (1 grad + {n.optimizer_states} optimizer states)",
        "kv_cache": (f"[{n.batch_prompts + 1} prompt caches x {layer_tokens(allocated)} + {KV_BATCH_COPIES} x "
                     f"{rows} rows x {layer_tokens(width)}] tokens x {d.kv_heads} KV heads x {d.head_dim} x 2 x "
                     f"{d.value_bytes} B") if not letters else letter_kv_note(d, n.batch_prompts, rows,
                                                                               n.prompt_tokens),
        "activations": activation_note(d, tokens, length, n.grad_checkpoint, shape, blocks),
        "logits": ((f"{rows} sampling rows x {d.vocab:,} x ({DECODE_LOGIT_COPIES} x {d.value_bytes} + 4) B"
                    if not letters else "one prefill chunk's MLP and attention scores, 26 letter logits a row")
                   if phase == "rollout" else logit_note(d, positions, letters)),
        "phase": (f"peak in the {phase} phase (rollout {gb(sum(rollout.values())):.2f} GB of KV cache + sampling "
                  f"logits, update {gb(sum(update.values())):.2f} GB of activations + loss logits)"),
    }
    return MemoryPlan(items, {k: v for k, v in notes.items() if k in items or k == "phase"})


def weight_note(d: ModelDims) -> str:
    linear, norms = text_parameters(d)
    if d.bits is None:
        return f"{linear + norms:,} params x {d.value_bytes} B"
    return (f"{linear:,} params x {d.bits} bits + {linear // d.group_size:,} groups x 2 x {d.value_bytes} B "
            f"(scale, bias) + {norms:,} norm params x {d.value_bytes} B")


def letter_kv_note(d: ModelDims, distinct: int, rows: int, prompt_tokens: int) -> str:
    return (f"[{distinct + 1} prompts x {prompt_tokens} + {rows} rows x ({prompt_tokens} + 5 letters)] tokens x "
            f"{d.layers} layers x {d.kv_heads} KV heads x {d.head_dim} x 2 x {d.value_bytes} B")


def activation_note(d: ModelDims, tokens: int, length: int, grad_checkpoint: bool, shape: str,
                    layers: int | None = None) -> str:
    layers = d.layers if layers is None else layers
    per = activation_values_per_token(d, length)
    if grad_checkpoint:
        return (f"checkpointed: {tokens} tokens ({shape}) x ({layers} layers x {d.hidden} + one layer's "
                f"{per:,}) values x {d.value_bytes} B")
    return f"{tokens} tokens ({shape}) x {layers} layers x {per:,} values x {d.value_bytes} B"


@dataclass(frozen=True)
class DecodeNumbers:
    rows: int                        # replies decoded in one call (games in lockstep, capped by the batch)
    distinct_prompts: int            # distinct boards among them
    prompt_tokens: int
    reply_tokens: int
    completion_batch_size: int
    rank: int
    num_layers: int
    keys: tuple | None
    decode: str = "grammar"


def decode_plan(d: ModelDims, n: DecodeNumbers) -> MemoryPlan:
    """Playing without training (eval, play, self-play): the weights, the adapter's LoRA weights (no gradients,
    no optimizer) and one decoding call's arrays, as a GRPO rollout has them."""
    lora = lora_parameters(d, n.rank, n.num_layers, n.keys) if n.rank else 0
    rollout = grpo_rollout_bytes(d, GRPONumbers(
        batch_prompts=n.distinct_prompts, generations=max(1, n.rows // max(n.distinct_prompts, 1)),
        prompt_tokens=n.prompt_tokens, reply_tokens=n.reply_tokens, completion_batch_size=n.completion_batch_size,
        max_tokens_per_microbatch=1, max_loss_tokens_per_microbatch=1, rank=n.rank, num_layers=n.num_layers,
        keys=n.keys, optimizer_states=0, decode=n.decode))
    notes = {"weights": weight_note(d), "lora": f"{lora:,} adapter params x 4 B (no gradients, no optimizer)",
             "kv_cache": (letter_kv_note(d, n.distinct_prompts, min(n.rows, n.completion_batch_size), n.prompt_tokens) if n.decode != "free" else
                          f"{n.rows} rows of {n.prompt_tokens} + {n.reply_tokens} tokens in mlx-lm's caches"),
             "logits": ("one prefill chunk's MLP and attention scores, 26 letter logits a row" if n.decode != "free"
                        else f"{min(n.rows, n.completion_batch_size)} sampling rows x {d.vocab:,} x "
                             f"({DECODE_LOGIT_COPIES} x {d.value_bytes} + 4) B"),
             "phase": f"one decoding call of {n.rows} replies in {n.decode} decoding"}
    return MemoryPlan({"weights": weight_bytes(d), "lora": lora * 4, **rollout}, notes)


def gb(n: int | float) -> float:
    return n / GB


def working_set_fraction(memory_gb: float) -> float:
    """The share of a Mac's `memory_gb` of unified memory that Metal recommends as a working set."""
    return SMALL_MAC_FRACTION if memory_gb <= SMALL_MAC_GB else LARGE_MAC_FRACTION


def working_set(memory_gb: float) -> float:
    """Bytes a Mac with `memory_gb` of unified memory lets MLX use comfortably."""
    return memory_gb * GB * working_set_fraction(memory_gb)


def working_set_note(memory_gb: float) -> str:
    return f"{memory_gb:g} GB x {working_set_fraction(memory_gb):.0%}"


def fitting_sizes(peak: int) -> list[int]:
    return [s for s in MAC_SIZES_GB if peak <= working_set(s)]


def largest_fitting(plan_for, budget_bytes: float, limit: int = 4096) -> int:
    """The largest n in 1..limit with plan_for(n).peak <= budget (0 if even n = 1 does not fit); peaks grow with n."""
    if plan_for(1).peak > budget_bytes:
        return 0
    lo, hi = 1, limit
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if plan_for(mid).peak <= budget_bytes:
            lo = mid
        else:
            hi = mid - 1
    return lo
