"""`wordle-mlx sft`: LoRA supervised fine-tuning on the teacher's data, resumable, with a run folder.

Reads `train.jsonl`/`valid.jsonl` from `wordle-mlx data`, renders each record with the tokenizer's
chat template (exactly what the rollout engine feeds the model) and trains LoRA adapters (mlx-lm's
layers; the base is frozen) with a small loop of our own: cross-entropy on assistant tokens only,
projected onto the vocabulary only at those positions (`llm/sft_loss.py`), batches built from
length-sorted examples in a per-epoch shuffled order, gradient accumulation, global-norm clipping, AdamW
with linear warmup then cosine decay. Every `valid_every` steps it logs the validation loss, every
`game_eval.every` steps it plays a few valid-split games with the rollout engine, every `save_every`
steps it writes a checkpoint. Everything goes to `logs/<run>/` (config.json, metrics.jsonl in the
format of docs/METRICS.md, checkpoints/, adapters/). `resume` continues from the last complete
checkpoint: adapters, optimizer state, step and data position are restored, and the dropout RNG is
re-seeded from (seed, step) every step, so the continued run computes what an uninterrupted one would.
Ctrl-C or SIGTERM ends the run after the current step with a checkpoint there (`stop_signals.py`).
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Literal

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np
from mlx.utils import tree_map
from pydantic import Field, model_validator

from ..config import StrictModel, config_hash, read_json_file, resolve_path
from ..errors import UserError
from ..fileio import remove_tree, write_json_atomic
from ..llm import lora
from ..llm.prompts import FORMAT_ERRORS, NOT_A_WORD, PromptConfig, system_prompt
from ..llm.sft_loss import SFTBatch, loss_sum, make_batch
from ..metrics import MetricsWriter, truncate_after_step
from ..progress import console, progress_bar
from ..stop_signals import StopSignals, agreed_stop
from .data import read_sft_jsonl


class LoraConfig(StrictModel):
    rank: int = Field(8, ge=1)
    scale: float = Field(20.0, gt=0, description="mlx-lm's LoRA scale (the update is scale * B A x).")
    dropout: float = Field(0.0, ge=0, lt=1)
    num_layers: int = Field(-1, ge=-1, description="Adapt the last N blocks; -1 = all.")
    keys: list[str] | None = Field(None, description="Module names inside a block, e.g. self_attn.q_proj; None = all linears.")
    train_layers: int | None = Field(None, ge=1, description="With init_adapter: only the LoRA weights of the last N "
                                     "blocks train, the others keep the adapter's values (None: all train).")


class GameEvalConfig(StrictModel):
    every: int = Field(0, ge=0, description="Play quick valid-split games every N steps; 0 = off.")
    games: int = Field(8, ge=1)
    max_tokens_per_turn: int = Field(96, ge=8)


class SFTConfig(StrictModel):
    model: str = "builtin:gemma-3-270m"
    dtype: str | None = None
    data: str = "../data/sft"
    logs_dir: str = "../logs"
    run_name: str | None = None
    seed: int = Field(0, ge=0, lt=2 ** 32)
    lora: LoraConfig = LoraConfig()
    init_adapter: str | None = Field(None, description="Start from this adapter folder's LoRA weights (an earlier "
                                     "run's adapters/, like mlx-lm's --resume-adapter-file); its rank and layers "
                                     "must match `lora` (a lower rank: grow_init_adapter). Optimizer and "
                                     "schedule start fresh.")
    grow_init_adapter: bool = Field(False, description="Let init_adapter have a lower rank than lora.rank: it is "
                                    "padded (new lora_a directions drawn as a fresh LoRA's, zero lora_b rows), so "
                                    "training starts from the adapter's exact outputs with more capacity.")
    steps: int = Field(200, ge=1)
    batch_size: int = Field(4, ge=1)
    grad_accumulation: int = Field(1, ge=1)
    learning_rate: float = Field(2e-4, gt=0)
    warmup_steps: int = Field(10, ge=0)
    min_lr_ratio: float = Field(0.1, ge=0, le=1, description="Cosine decay ends at learning_rate * this.")
    weight_decay: float = Field(0.0, ge=0)
    grad_clip: float = Field(1.0, ge=0, description="Global gradient-norm clip; 0 = off.")
    max_seq_length: int = Field(1024, ge=16)
    pad_to: int = Field(32, ge=1, description="Pad batch widths and target counts to multiples of this.")
    share_prefix: bool = Field(True, description="Run the start that all examples of a batch share (chat "
                               "markers, system line) once per batch: the same loss, less work.")
    letter_targets: Literal["label", "allowed"] = Field(
        "label", description="Letters-format data only. 'label': every letter of the guess is trained towards the "
        "label's letter (plain cross-entropy). 'allowed': each letter is trained towards every letter that, after "
        "the label's earlier letters, still begins an allowed guess (the 12,972-word list, never the answer list), "
        "with loss -log of their total probability: it rewards spelling real words, not which word to play. Measured "
        "(docs/RESULTS.md, session 24): from the shipped adapter it broke greedy play within 40 steps (45 -> 0 / "
        "200 wins), since nothing then holds the model's choice among real words.")
    rejected_reply_weight: float = Field(
        0.0, ge=0, description="Letters-format data only. > 0: every record whose prompt reports a non-word (meta "
        "retry_error ['not_a_word', W], e.g. `choice`'s own_retries) also trains the model away from saying W again: "
        "one more example, the same prompt followed by W's reply up to its first letter that no allowed guess "
        "continues with, whose only target is that letter, with the unlikelihood loss -log(1 - p) times this "
        "weight. The logged training loss includes them; validation loss leaves them out (it stays the labels' "
        "cross-entropy). 0 = off. Measured "
        "(docs/RESULTS.md, session 26): a rejected word came back less often (49% of second tries, from 69%), but "
        "greedy play lost: 56 -> 43 / 200 at weight 1, 41 at 0.3.")
    grad_checkpoint: bool = False
    valid_every: int = Field(50, ge=0)
    valid_batches: int = Field(0, ge=0, description="Validation batches per pass; 0 = all.")
    game_eval: GameEvalConfig = GameEvalConfig()
    save_every: int = Field(50, ge=1)
    keep_checkpoints: int = Field(2, ge=1)
    progress: bool = True

    @model_validator(mode="after")
    def _check_init_adapter_options(self) -> "SFTConfig":
        if self.grow_init_adapter and self.init_adapter is None:
            raise ValueError("grow_init_adapter = true needs init_adapter (the lower-rank adapter to grow)")
        if self.lora.train_layers is not None and self.init_adapter is None:
            raise ValueError(f"lora.train_layers = {self.lora.train_layers} needs init_adapter (a fresh LoRA covers "
                             "the last lora.num_layers blocks, set that instead)")
        return self


def lr_schedule(cfg: SFTConfig):
    decay = optim.cosine_decay(cfg.learning_rate, max(cfg.steps - cfg.warmup_steps, 1),
                               cfg.learning_rate * cfg.min_lr_ratio)
    if cfg.warmup_steps == 0:
        return decay
    warmup = optim.linear_schedule(cfg.learning_rate / (cfg.warmup_steps + 1), cfg.learning_rate, cfg.warmup_steps)
    return optim.join_schedules([warmup, decay], [cfg.warmup_steps])


def tokenize(records: list[dict], tokenizer, source: Path, letter_targets: str = "label",
             rejected_reply_weight: float = 0.0) -> list[tuple]:
    """(token ids of the whole chat, length of the prompt part) per record, as mlx-lm's ChatDataset does;
    with `letter_targets="allowed"` a third element maps each guess letter's token index to the letter
    tokens that keep the guess on the way to an allowed word (`SFTConfig.letter_targets`). With
    `rejected_reply_weight` > 0, a record whose prompt reports a non-word is followed by its rejected-reply
    example (`rejected_reply_example`)."""
    out = []
    spelling = allowed_letter_tokens(tokenizer) if letter_targets == "allowed" else None
    rejected = rejected_reply_example(tokenizer, rejected_reply_weight) if rejected_reply_weight > 0 else None
    for i, r in enumerate(records, start=1):
        full = tokenizer.apply_chat_template(r["messages"], return_dict=False)
        prompt = tokenizer.apply_chat_template(r["messages"][:-1], add_generation_prompt=True, return_dict=False)
        if full[: len(prompt)] != prompt or len(full) <= len(prompt):
            raise UserError(f"{source}: record {i}: the chat template does not render the prompt as a prefix")
        out.append((full, len(prompt)) if spelling is None else (full, len(prompt), spelling(full, len(prompt), source, i)))
        error = (r.get("meta") or {}).get("retry_error") if rejected is not None else None
        if error is not None and not (isinstance(error, list) and len(error) == 2):
            raise UserError(f"{source}: record {i}: meta.retry_error: expected [error kind, reply], got {error!r}")
        if error is not None and error[0] == NOT_A_WORD:
            out.append(rejected(prompt, error[1], source, i))
    return out


def letters_template_and_trie(tokenizer, option: str):
    """(the tokenizer's letters-reply template, the prefix trie of the allowed guesses) for an SFT `option`
    that reads letters replies; a tokenizer without single-letter tokens is a one-line error naming it."""
    from ..game.words import guess_list
    from ..llm.generation import end_token_ids
    from ..llm.word_constraint import LettersTemplate, prefix_trie

    try:
        template = LettersTemplate(tokenizer, min(end_token_ids(tokenizer)))
    except UserError as e:
        raise UserError(f"{option}: {str(e).removeprefix('--constrain: ')}") from None
    return template, prefix_trie(guess_list())


def rejected_reply_example(tokenizer, weight: float):
    """A function (prompt tokens, rejected word W, source, record) -> (tokens, prompt_length, {}, {index:
    weight}): the prompt, then W's letters-format reply up to and including its first letter that no allowed
    guess continues with (W[:k] begins an allowed guess, W[:k + 1] does not), which is the one target."""
    template, trie = letters_template_and_trie(tokenizer, "rejected_reply_weight")

    def example(prompt: list[int], word: str, source: Path, record: int) -> tuple:
        if not (isinstance(word, str) and len(word) == 5 and word.isascii() and word.isalpha() and word.islower()):
            raise UserError(f"{source}: record {record}: meta.retry_error: expected a 5-letter lower-case non-word, "
                            f"got {word!r}")
        k = next((k for k in range(5) if word[k] not in trie.get(word[:k], ())), None)
        if k is None:
            raise UserError(f"{source}: record {record}: meta.retry_error: {word!r} is an allowed guess, not a non-word")
        tokens = list(prompt) + list(template.open) + [template.letter[c] for c in word[:k + 1]]
        return tokens, len(prompt), {}, {len(tokens) - 1: weight}

    return example


def allowed_letter_tokens(tokenizer):
    """A function (tokens, prompt_length, source, record) -> {token index: acceptable letter token ids} for
    the letters-format guess in the reply: at letter k, every letter that follows the label's first k letters
    in some allowed guess."""
    template, trie = letters_template_and_trie(tokenizer, "letter_targets 'allowed'")
    opening = list(template.open)

    def sets(tokens: list[int], prompt_length: int, source: Path, record: int) -> dict[int, list[int]]:
        reply = tokens[prompt_length:]
        at = next((k for k in range(len(reply) - 7) if reply[k:k + 3] == opening), None)
        letters = [template.letter_of.get(t) for t in reply[at + 3:at + 8]] if at is not None else []
        word = "".join(c or "?" for c in letters)
        if len(letters) != 5 or word[:4] not in trie or word[4] not in trie[word[:4]]:
            raise UserError(f"{source}: record {record}: letter_targets 'allowed' needs a letters-format reply "
                            f"spelling an allowed guess, got {tokenizer.decode(reply)!r}")
        first = prompt_length + at + 3
        return {first + k: [template.letter[c] for c in sorted(trie[word[:k]])] for k in range(5)}

    return sets


def make_batches(seqs: list[tuple], cfg: SFTConfig, world=None) -> list[SFTBatch | None]:
    """Length buckets: examples sorted by length, cut into batches of `batch_size` (the last may be smaller).
    With several ranks each global batch is split: a rank keeps its examples rank, rank + size, ... of it
    (None when a short last batch leaves it none)."""
    rank, size = (world.rank, world.size) if world is not None else (0, 1)
    order = sorted(range(len(seqs)), key=lambda i: (len(seqs[i][0]), i))
    shares = [order[s:s + cfg.batch_size][rank::size] for s in range(0, len(order), cfg.batch_size)]
    return [make_batch([seqs[i] for i in mine], cfg.pad_to, cfg.max_seq_length, cfg.share_prefix) if mine else None
            for mine in shares]


def batch_at(position: int, n_batches: int, seed: int) -> int:
    """Which batch is the `position`-th one drawn: a fresh shuffle of all batches every epoch."""
    epoch, offset = divmod(position, n_batches)
    return int(np.random.default_rng([seed, epoch]).permutation(n_batches)[offset])


def mean_gradient(model, loss_and_grad, batches: list[SFTBatch | None], world=None):
    """(gradient of the token-mean loss, summed loss, target tokens, tokens) over `batches` on every rank:
    gradient and loss *sums* are all-reduced and divided once by the global target count, which equals
    the one-process gradient on the union of the ranks' examples. A None batch contributes nothing."""
    grads, total, count, length = None, 0.0, 0.0, 0
    for b in batches:
        if b is None:                    # this rank has no example in a short last batch
            continue
        (s, n), g = loss_and_grad(model, b.inputs, b.positions, b.targets, b.weights, False, b.prefix, b.choices,
                                  b.unlikely)
        grads = g if grads is None else tree_map(mx.add, grads, g)
        mx.eval(grads, s, n)
        total, count, length = total + s.item(), count + n.item(), length + b.length
    if grads is None:
        grads = tree_map(mx.zeros_like, model.trainable_parameters())
    if world is not None:
        grads = world.sum_tree(grads)
        total, count, length = world.sum_floats([total, count, length])
    return tree_map(lambda x: x / count, grads), total, count, int(length)


def evaluate_loss(model, batches: list[SFTBatch], world=None) -> float:
    """Token-weighted validation loss; with several ranks, over every rank's batches."""
    total, count = 0.0, 0.0
    for b in batches:
        s, n = loss_sum(model, b.inputs, b.positions, b.targets, b.weights, False, b.prefix, b.choices, b.unlikely)
        mx.eval(s, n)
        total, count = total + s.item(), count + n.item()
    if world is not None:
        total, count = world.sum_floats([total, count], "all_sum of validation loss")
    return total / max(count, 1.0)


def game_eval(model, tokenizer, cfg: SFTConfig, prompt: PromptConfig, world) -> dict:
    from ..game.splits import split_words
    from ..game.words import guess_list
    from ..llm.distributed import interleave
    from ..llm.rollout import GameSpec, RolloutConfig, play_games

    specs = [GameSpec(secret=w) for w in world.shard(split_words("valid")[: cfg.game_eval.games])]
    rcfg = RolloutConfig(prompt=prompt, max_tokens_per_turn=cfg.game_eval.max_tokens_per_turn)
    episodes = play_games(model, tokenizer, specs, rcfg, set(guess_list())) if specs else []
    model.train()
    turns = [t for e in episodes for t in e.turns]
    parts = world.gather_json({"won": [e.won for e in episodes], "games": [e.outcome() for e in episodes],
                               "format_errors": [t.error in FORMAT_ERRORS for t in turns]}, "all_gather of eval games")
    won, errors = [w for p in parts for w in p["won"]], [f for p in parts for f in p["format_errors"]]
    return {"win_rate": float(np.mean(won)),
            "format_error_rate": float(np.mean(errors)) if errors else 0.0,
            "games": interleave([p["games"] for p in parts])}


def prepare_run_dir(cfg: SFTConfig, resume: str | None, overwrite: bool) -> Path:
    if resume is not None:
        run_dir = Path(resume)
        if not (run_dir / "config.json").is_file():
            raise UserError(f"--resume {resume}: not a run folder (no config.json)")
        return run_dir
    name = cfg.run_name or time.strftime("sft-%Y%m%d-%H%M%S")
    run_dir = resolve_path(cfg, cfg.logs_dir).resolve() / name
    if run_dir.exists() and any(run_dir.iterdir()):
        if not overwrite:
            raise UserError(f"run folder {run_dir} already exists; pass --overwrite or --run-name NEW or --resume {run_dir}")
        remove_tree(run_dir)   # a kill midway leaves the old run whole or gone
    return run_dir             # made once the run has started (a failed start leaves no folder behind)


def load_data(cfg: SFTConfig):
    folder = resolve_path(cfg, cfg.data).resolve()
    train = read_sft_jsonl(folder / "train.jsonl")
    valid = read_sft_jsonl(folder / "valid.jsonl") if cfg.valid_every else []
    stats = folder / "stats.json"
    if stats.is_file():
        return folder, train, valid, PromptConfig(**read_json_file(stats)["prompt"])
    # No stats.json: the adapter will record the default prompt, so data made with another one would be played
    # with the wrong prompt afterwards (every reply a format error). Say so instead of training on.
    prompt = PromptConfig()
    expected = system_prompt(prompt)
    for lineno, record in enumerate(train, 1):
        system = next((m["content"] for m in record["messages"] if m["role"] == "system"), None)
        if system is not None and system != expected:
            raise UserError(f"{stats}: missing, and {folder / 'train.jsonl'} record {lineno} has the system prompt "
                            f"{system[:70]!r}, not the default prompt's; copy stats.json (its 'prompt' is saved with "
                            f"the adapter) from the folder this data was made from")
    return folder, train, valid, prompt


def run(cfg: SFTConfig, resume: str | None = None, overwrite: bool = False) -> dict:
    from ..llm.distributed import NullWriter, check_world_size, init_world, write_weights_hash
    from ..llm.models import load_model

    world = init_world()                 # under mlx.launch: this rank's share of every batch; else a group of one
    world.check_divisible(cfg.batch_size, "batch_size")
    main, show = world.is_main, cfg.progress and world.is_main      # rank 0 alone writes files and prints
    run_dir = Path(world.broadcast_json(str(prepare_run_dir(cfg, resume, overwrite)) if main else None))
    data_dir, train_records, valid_records, prompt_cfg = load_data(cfg)
    model, tokenizer = load_model(cfg.model, dtype=cfg.dtype)
    if main:
        from .plan import warn_if_over_working_set
        warn_if_over_working_set("sft", cfg)     # one line on stderr when the plan exceeds this machine's memory
    mx.random.seed(cfg.seed)
    lora_params = lora.lora_parameters(cfg.lora.rank, cfg.lora.scale, cfg.lora.dropout, cfg.lora.keys)
    trainable = lora.apply_lora(model, cfg.lora.num_layers, lora_params)
    adapter_cfg = lora.adapter_config(cfg.lora.num_layers, lora_params, cfg.model, prompt_cfg.model_dump())
    init_adapter = resolve_path(cfg, cfg.init_adapter).resolve() if cfg.init_adapter else None
    if init_adapter is not None and resume is None:    # a resumed run takes its weights from the checkpoint
        lora.load_adapter_weights(model, init_adapter, grow_rank=cfg.grow_init_adapter, scale=cfg.lora.scale)
    if cfg.lora.train_layers is not None:              # before the optimizer and any checkpoint are loaded
        trainable = lora.freeze_lora_below(model, cfg.lora.train_layers)
    if cfg.grad_checkpoint:
        from ..llm.logits import set_grad_checkpoint
        set_grad_checkpoint(model)
    from ..llm.memory import configure_metal_memory, free_cache
    configure_metal_memory()

    if cfg.rejected_reply_weight > 0 and prompt_cfg.guess_format != "letters":
        raise UserError(f"{cfg.data}: rejected_reply_weight needs letters-format data (stats.json prompt.guess_format "
                        f"is {prompt_cfg.guess_format!r})")
    if cfg.letter_targets == "allowed" and prompt_cfg.guess_format != "letters":
        raise UserError(f"{cfg.data}: letter_targets 'allowed' needs letters-format data (stats.json prompt.guess_format "
                        f"is {prompt_cfg.guess_format!r})")
    train_batches = make_batches(tokenize(train_records, tokenizer, data_dir / "train.jsonl", cfg.letter_targets,
                                          cfg.rejected_reply_weight), cfg, world)
    valid_batches = (make_batches(tokenize(valid_records, tokenizer, data_dir / "valid.jsonl", cfg.letter_targets), cfg)
                     if valid_records else [])
    if cfg.valid_batches and cfg.valid_batches < len(valid_batches):
        # batches are sorted by length: take them evenly across lengths, not just the shortest (empty boards)
        picks = np.unique(np.linspace(0, len(valid_batches) - 1, cfg.valid_batches).round().astype(int))
        valid_batches = [valid_batches[i] for i in picks]
    has_valid, valid_batches = bool(valid_batches), world.shard(valid_batches)   # a rank may get none
    schedule = lr_schedule(cfg)
    optimizer = optim.AdamW(learning_rate=schedule, weight_decay=cfg.weight_decay)

    step, position = 0, 0
    checkpoints = run_dir / "checkpoints"
    if resume is not None:
        state = None
        if main:                         # rank 0 reads the checkpoint; the others receive it
            ckpt = lora.latest_checkpoint(checkpoints)
            if ckpt is None:
                raise UserError(f"--resume {resume}: no complete checkpoint in {checkpoints}")
            state = lora.load_checkpoint(ckpt, model, optimizer)
        else:
            optimizer.init(model.trainable_parameters())
        state = world.broadcast_json(state)
        check_world_size(state, world, f"--resume {resume}")
        step, position = int(state["step"]), int(state["data_position"])
    world.broadcast_training_state(model, optimizer if resume is not None else None)
    saved = cfg.model_copy(update={"data": str(data_dir), "logs_dir": str(run_dir.parent), "run_name": run_dir.name,
                                   "init_adapter": str(init_adapter) if init_adapter else None})
    if resume is None and main:
        run_dir.mkdir(parents=True, exist_ok=True)
        write_json_atomic(run_dir / "config.json", saved.model_dump(mode="json"))

    loss_and_grad = nn.value_and_grad(model, loss_sum)
    if resume is not None and main:
        truncate_after_step(run_dir / "metrics.jsonl", step)
    metrics = MetricsWriter(run_dir / "metrics.jsonl") if main else NullWriter()
    metrics.write({"kind": "run", "stage": "sft", "run": run_dir.name, "config_hash": config_hash(saved),
                   "config": saved.model_dump(mode="json"), "time": time.time(),
                   "resumed_from_step": step if resume is not None else None,
                   "trainable_parameters": trainable, "train_batches": len(train_batches), "world_size": world.size})
    if show:
        console.print(f"sft {run_dir.name}: {len(train_records)} examples in {len(train_batches)} batches, "
                      f"{trainable / 1e6:.2f}M trainable parameters, steps {step + 1}..{cfg.steps}")
    model.train()
    last_loss, last_val, stop_signal = math.nan, None, None
    with StopSignals(announce=main) as stop, progress_bar("sft", cfg.steps - step, enabled=show) as advance:
        while step < cfg.steps and not stop_signal:
            step += 1
            mx.random.seed(cfg.seed * 1_000_003 + step + world.rank * 15_485_863)   # dropout masks differ per rank
            start = time.perf_counter()
            batches = [train_batches[batch_at(position + i, len(train_batches), cfg.seed)]
                       for i in range(cfg.grad_accumulation)]
            position += cfg.grad_accumulation
            grads, total, count, length = mean_gradient(model, loss_and_grad, batches, world)
            if cfg.grad_clip > 0:
                grads, norm = optim.clip_grad_norm(grads, cfg.grad_clip)
            else:
                norm = optim.clip_grad_norm(grads, float("inf"))[1]
            lr = float(schedule(mx.array(step - 1)))   # the optimizer applies schedule(updates so far)
            optimizer.update(model, grads)
            mx.eval(model.parameters(), optimizer.state, norm)
            seconds = time.perf_counter() - start
            last_loss = total / count
            if not math.isfinite(last_loss):
                raise UserError(f"sft: loss became {last_loss} at step {step}; lower learning_rate")
            metrics.write({"kind": "sft", "step": step, "time": time.time(), "lr": lr, "loss": last_loss,
                           "grad_norm": norm.item(), "tokens": length, "target_tokens": int(count),
                           "tokens_per_second": length / seconds, "peak_memory_gb": mx.get_peak_memory() / 1e9})
            advance(1, info=f"loss {last_loss:.3f}  {length / seconds:.0f} tok/s")
            record = None
            if cfg.valid_every and has_valid and (step % cfg.valid_every == 0 or step == cfg.steps):
                model.eval()
                last_val = evaluate_loss(model, valid_batches, world)
                model.train()
                record = {"kind": "sft_valid", "step": step, "time": time.time(), "val_loss": last_val}
            if cfg.game_eval.every and (step % cfg.game_eval.every == 0 or step == cfg.steps):
                record = record or {"kind": "sft_valid", "step": step, "time": time.time()}
                record.update(game_eval(model, tokenizer, cfg, prompt_cfg, world))
            if record is not None:
                free_cache()                 # validation's and the games' buffers, before the next step
                metrics.write(record)
            if step < cfg.steps:
                stop_signal = agreed_stop(stop, world)
            if main and (step % cfg.save_every == 0 or step == cfg.steps or stop_signal):
                lora.save_checkpoint(checkpoints, step, model, optimizer, adapter_cfg,
                                     {"data_position": position, "seed": cfg.seed, "world_size": world.size,
                                      "rng": f"mx.random.seed({cfg.seed} * 1000003 + step) before every step"})
                lora.prune_checkpoints(checkpoints, cfg.keep_checkpoints)
    metrics.close()
    write_weights_hash(model, world, "sft")
    adapters = lora.save_adapters(run_dir / "adapters", model, adapter_cfg) if main else run_dir / "adapters"
    result = {"run_dir": str(run_dir), "adapters": str(adapters), "steps": step, "signal": stop_signal,
              "stopped": f"stopped by {stop_signal}" if stop_signal else "finished", "final_loss": last_loss,
              "val_loss": last_val, "peak_memory_gb": round(mx.get_peak_memory() / 1e9, 3)}
    if show:
        console.print(f"adapters saved to {adapters}")
    return result
