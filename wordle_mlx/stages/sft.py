"""`wordle-mlx sft`: LoRA supervised fine-tuning on the teacher's data, resumable, with a run folder.

Reads `train.jsonl`/`valid.jsonl` from `wordle-mlx data`, renders each record with the tokenizer's
chat template (exactly what the rollout engine feeds the model) and trains LoRA adapters (mlx-lm's
layers; the base is frozen) with a small loop of our own: cross-entropy on assistant tokens only,
projected onto the vocabulary only at those positions (`llm/training/sft_loss.py`), batches built from
length-sorted examples in a per-epoch shuffled order, gradient accumulation, global-norm clipping, AdamW
with linear warmup then cosine decay. Every `valid_every` steps it logs the validation loss, every
`game_eval.every` steps it plays a few valid-split games with the rollout engine, every `save_every`
steps it writes a checkpoint. `decode` picks the loss: the full loss (free), the reply's letters as choices among
the 26 letter tokens (grammar), or among the letters that continue an allowed word off the board (words), with
`train_tags` adding the reply's forced tokens; the adapter records which (`decode`, `trained_tags` in
adapter_config.json), and eval, play and export default to it. Everything goes to `logs/<run>/` (config.json, metrics.jsonl in the
format of docs/METRICS.md, checkpoints/, adapters/). `resume` continues from the last complete
checkpoint: adapters, optimizer state, step and data position are restored, and the dropout RNG is
re-seeded from (seed, step) every step, so the continued run computes what an uninterrupted one would.
Ctrl-C or SIGTERM ends the run after the current step with a checkpoint there (`stop_signals.py`).
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np
from mlx.utils import tree_map

from ..config import config_hash, config_relative_path, display_path, read_json_file, resolve_path
from ..errors import UserError
from ..fileio import remove_tree, write_json_atomic
from ..llm.model import lora
from ..llm.play.prompts import FORMAT_ERRORS, PromptConfig, system_prompt
from ..llm.play.reply_grammar import adapter_decoding, decoding_record
from ..llm.training.sft_loss import LetterLoss, SFTBatch, letter_loss, loss_sum, make_batch
from ..metrics import MetricsWriter, truncate_after_step
from ..progress import console, progress_bar
from ..stop_signals import StopSignals, agreed_stop
from .data import read_sft_jsonl
from .sft_config import SFTConfig


def lr_schedule(cfg: SFTConfig):
    decay = optim.cosine_decay(cfg.learning_rate, max(cfg.steps - cfg.warmup_steps, 1),
                               cfg.learning_rate * cfg.min_lr_ratio)
    if cfg.warmup_steps == 0:
        return decay
    warmup = optim.linear_schedule(cfg.learning_rate / (cfg.warmup_steps + 1), cfg.learning_rate, cfg.warmup_steps)
    return optim.join_schedules([warmup, decay], [cfg.warmup_steps])


def tokenize(records: list[dict], tokenizer, source: Path) -> list[tuple]:
    """(token ids of the whole chat, length of the prompt part) per record, as mlx-lm's ChatDataset does."""
    out = []
    for i, r in enumerate(records, start=1):
        full = tokenizer.apply_chat_template(r["messages"], return_dict=False)
        prompt = tokenizer.apply_chat_template(r["messages"][:-1], add_generation_prompt=True, return_dict=False)
        if full[: len(prompt)] != prompt or len(full) <= len(prompt):
            raise UserError(f"{source}: record {i}: the chat template does not render the prompt as a prefix")
        out.append((full, len(prompt)))
    return out


def with_boards(seqs: list[tuple], records: list[dict]) -> list[tuple]:
    """(tokens, prompt length, the board's words from meta.history, or None when the record has none)."""
    out = []
    for (tokens, prompt_length), r in zip(seqs, records):
        meta = r.get("meta")
        history = meta.get("history") if isinstance(meta, dict) else None
        out.append((tokens, prompt_length, tuple(history) if isinstance(history, list) else None))
    return out


def make_batches(seqs: list[tuple], cfg: SFTConfig, world=None, letters: LetterLoss | None = None
                 ) -> list[SFTBatch | None]:
    """Length buckets: examples sorted by length, cut into batches of `batch_size` (the last may be smaller).
    With several ranks each global batch is split: a rank keeps its examples rank, rank + size, ... of it
    (None when a short last batch leaves it none). `letters`: the grammar or words loss."""
    rank, size = (world.rank, world.size) if world is not None else (0, 1)
    order = sorted(range(len(seqs)), key=lambda i: (len(seqs[i][0]), i))
    shares = [order[s:s + cfg.batch_size][rank::size] for s in range(0, len(order), cfg.batch_size)]
    extra = {} if letters is None else {"letter_ids": letters.letter_ids, "trie": letters.trie,
                                        "train_tags": letters.train_tags}
    return [make_batch([(*seqs[i][:2], seqs[i][2] if len(seqs[i]) > 2 and seqs[i][2] else ()) for i in mine],
                       cfg.pad_to, cfg.max_seq_length,
                       cfg.share_prefix, **extra) if mine else None for mine in shares]


def trained_decoding(cfg: SFTConfig, start_adapter: Path | None) -> dict:
    """The adapter_config.json record of this run: its decode, and whether the reply's tags were trained (by the
    full loss, by train_tags, or by the adapter it started from)."""
    _, start_tags = adapter_decoding(start_adapter)
    return decoding_record(cfg.decode, cfg.decode == "free" or cfg.train_tags or bool(start_tags))


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
        (s, n), g = loss_and_grad(model, *b.loss_args())
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
        s, n = loss_sum(model, *b.loss_args())
        mx.eval(s, n)
        total, count = total + s.item(), count + n.item()
    if world is not None:
        total, count = world.sum_floats([total, count], "all_sum of validation loss")
    return total / max(count, 1.0)


def game_eval(model, tokenizer, cfg: SFTConfig, prompt: PromptConfig, world) -> dict:
    from ..game.splits import split_words
    from ..game.words import guess_list
    from ..llm.training.distributed import interleave
    from ..llm.play.rollout import GameSpec, RolloutConfig, play_games

    specs = [GameSpec(secret=w) for w in world.shard(split_words("valid")[: cfg.game_eval.games])]
    words = {"decode": "words"} if cfg.decode == "words" else {}     # else the default, grammar where it applies
    rcfg = RolloutConfig(prompt=prompt, max_tokens_per_turn=cfg.game_eval.max_tokens_per_turn, **words)
    episodes = play_games(model, tokenizer, specs, rcfg, set(guess_list())) if specs else []
    model.train()
    turns = [t for e in episodes for t in e.turns]
    parts = world.gather_json({"won": [e.won for e in episodes], "games": [e.outcome() for e in episodes],
                               "format_errors": [t.error in FORMAT_ERRORS for t in turns]}, "all_gather of eval games")
    won, errors = [w for p in parts for w in p["won"]], [f for p in parts for f in p["format_errors"]]
    return {"win_rate": float(np.mean(won)),
            "format_error_rate": float(np.mean(errors)) if errors else 0.0,
            "games": interleave([p["games"] for p in parts])}


def prepare_run_dir(cfg: SFTConfig) -> Path:
    resume = cfg.resume
    if resume is not None:
        run_dir = Path(resume)
        if not (run_dir / "config.json").is_file():
            raise UserError(f"--resume {resume}: not a run folder (no config.json)")
        return run_dir
    name = cfg.run_name or time.strftime("sft-%Y%m%d-%H%M%S")
    run_dir = resolve_path(cfg, cfg.logs_dir).resolve() / name
    if run_dir.exists() and any(run_dir.iterdir()):
        if not cfg.overwrite:
            shown = display_path(run_dir)
            raise UserError(f"run folder {shown} already exists; pass --overwrite or --run-name NEW or "
                            f"--resume {shown}")
        remove_tree(run_dir)   # a kill midway leaves the old run whole or gone
    return run_dir             # made once the run has started (a failed start leaves no folder behind)


def load_data(cfg: SFTConfig):
    folder = Path(display_path(resolve_path(cfg, cfg.data).resolve()))   # messages name it as the user would
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


def run(cfg: SFTConfig) -> dict:
    from ..llm.training.distributed import NullWriter, check_world_size, init_world, write_weights_hash
    from ..llm.model.models import load_model

    world = init_world()                 # under mlx.launch: this rank's share of every batch; else a group of one
    world.check_divisible(cfg.batch_size, "batch_size")
    main, show = world.is_main, cfg.progress and world.is_main      # rank 0 alone writes files and prints
    resume = cfg.resume
    run_dir = Path(world.broadcast_json(str(prepare_run_dir(cfg)) if main else None))
    data_dir, train_records, valid_records, prompt_cfg = load_data(cfg)
    model, tokenizer = load_model(cfg.model, dtype=cfg.dtype)
    if main:
        from .plan import warn_if_over_working_set
        warn_if_over_working_set("sft", cfg)     # one line on stderr when the plan exceeds this machine's memory
    mx.random.seed(cfg.seed)
    lora_params = lora.lora_parameters(cfg.lora.rank, cfg.lora.scale, cfg.lora.dropout, cfg.lora.keys)
    trainable = lora.apply_lora(model, cfg.lora.num_layers, lora_params)
    adapter_cfg = lora.adapter_config(cfg.lora.num_layers, lora_params, cfg.model, prompt_cfg.model_dump())
    start_adapter = resolve_path(cfg, cfg.start_adapter).resolve() if cfg.start_adapter else None
    adapter_cfg.update(trained_decoding(cfg, start_adapter))
    if start_adapter is not None and resume is None:   # a resumed run takes its weights from the checkpoint
        lora.load_adapter_weights(model, start_adapter, scale=cfg.lora.scale)
    if cfg.lora.train_layers is not None:              # before the optimizer and any checkpoint are loaded
        trainable = lora.freeze_lora_below(model, cfg.lora.train_layers)
    if cfg.grad_checkpoint:
        from ..llm.model.logits import set_grad_checkpoint
        set_grad_checkpoint(model)
    from ..llm.model.memory import configure_metal_memory, free_cache
    configure_metal_memory()

    train_seqs = with_boards(tokenize(train_records, tokenizer, data_dir / "train.jsonl"), train_records)
    letters = letter_loss(cfg.decode, cfg.train_tags, tokenizer, prompt_cfg, train_seqs, data_dir / "train.jsonl")
    valid_seqs = with_boards(tokenize(valid_records, tokenizer, data_dir / "valid.jsonl"), valid_records)
    if letters is not None and valid_seqs:
        letter_loss(cfg.decode, cfg.train_tags, tokenizer, prompt_cfg, valid_seqs, data_dir / "valid.jsonl")
    train_batches = make_batches(train_seqs, cfg, world, letters)
    valid_batches = make_batches(valid_seqs, cfg, None, letters) if valid_records else []
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
    # config.json's paths are relative to the run folder (what load_config resolves them against on --resume)
    # while the run folder and they lie inside the working folder, so the run can move with its checkout
    saved = cfg.model_copy(update={"data": config_relative_path(data_dir, run_dir),
                                   "logs_dir": config_relative_path(run_dir.parent, run_dir), "run_name": run_dir.name,
                                   "start_adapter": (config_relative_path(start_adapter, run_dir)
                                                     if start_adapter else None),
                                   "resume": None, "overwrite": False})
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
            if cfg.max_grad_norm > 0:
                grads, norm = optim.clip_grad_norm(grads, cfg.max_grad_norm)
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
            if main and ((cfg.save_every and step % cfg.save_every == 0) or step == cfg.steps or stop_signal):
                lora.save_checkpoint(checkpoints, step, model, optimizer, adapter_cfg,
                                     {"data_position": position, "seed": cfg.seed, "world_size": world.size,
                                      "rng": f"mx.random.seed({cfg.seed} * 1000003 + step) before every step"})
                lora.prune_checkpoints(checkpoints, cfg.keep_checkpoints)
    metrics.close()
    write_weights_hash(model, world, "sft")
    adapters = lora.save_adapters(run_dir / "adapters", model, adapter_cfg) if main else run_dir / "adapters"
    result = {"run_dir": display_path(run_dir), "adapters": display_path(adapters), "steps": step,
              "signal": stop_signal,
              "stopped": f"stopped by {stop_signal}" if stop_signal else "finished", "final_loss": last_loss,
              "val_loss": last_val, "peak_memory_gb": round(mx.get_peak_memory() / 1e9, 3)}
    if show:
        console.print(f"adapters saved to {display_path(adapters)}")
    return result
