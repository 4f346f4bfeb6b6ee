"""`wordle-mlx sft`: LoRA supervised fine-tuning on the teacher's data, in the shared training loop.

Reads `train.jsonl`/`valid.jsonl` from `wordle-mlx data`, renders each record with the tokenizer's chat template
(exactly what the rollout engine feeds the model) and trains LoRA adapters (mlx-lm's layers; the base is frozen):
cross-entropy on assistant tokens only, projected onto the vocabulary only at those positions
(`llm/training/sft_loss.py`), one batch of length-sorted examples a step, drawn in a fresh shuffled order every
epoch. `decode` picks the loss: the full loss (free), the reply's letters as choices among the 26 letter tokens
(grammar), or among the letters that continue an allowed word off the board (words), with `train_free` adding the
full loss of every reply token; the adapter records which, and eval, play and export default to it. Every
`validation.every` steps it logs the validation loss and plays `validation.games` valid-split games. The run
folder, checkpoints, resume, metrics and stop signals are the shared loop's (`llm/training/trainer.py`); a
checkpoint carries the data position, and the dropout RNG is re-seeded from (seed, step) every step, so a
resumed run computes what an uninterrupted one would.
"""

from __future__ import annotations

import time
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_map

from ..config import display_path, read_json_file, resolve_path
from ..errors import UserError
from ..game.splits import split_words
from ..game.words import guess_list
from ..llm.play.prompts import FORMAT_ERRORS, PromptConfig, system_prompt
from ..llm.play.rollout import GameSpec, RolloutConfig, play_games
from ..llm.training.distributed import init_world, interleave
from ..llm.training.policy import load_policy, start_adapter
from ..llm.training.sft_loss import LetterLoss, SFTBatch, letter_loss, loss_sum, make_batch
from ..llm.training.trainer import Task, apply_update, make_optimizer, open_run, train
from .data import read_sft_jsonl
from .plan import warn_if_over_working_set
from .sft_config import SFTConfig


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
    size_ = cfg.data.batch_size
    shares = [order[s:s + size_][rank::size] for s in range(0, len(order), size_)]
    extra = {} if letters is None else {"letter_ids": letters.letter_ids, "trie": letters.trie,
                                        "train_free": letters.train_free}
    return [make_batch([(*seqs[i][:2], seqs[i][2] if len(seqs[i]) > 2 and seqs[i][2] else ()) for i in mine],
                       cfg.data.pad_to, cfg.data.max_seq_length, True, **extra) if mine else None for mine in shares]


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
    """Play the first validation.games valid-split words greedily: words decoding after a words loss, else
    grammar decoding (where the prompt's format allows it)."""
    specs = [GameSpec(secret=w) for w in world.shard(split_words("valid")[: cfg.validation.games])]
    words = {"decode": "words"} if cfg.decode == "words" else {}
    rcfg = RolloutConfig(prompt=prompt, max_tokens_per_turn=cfg.max_tokens, **words)
    episodes = play_games(model, tokenizer, specs, rcfg, set(guess_list())) if specs else []
    model.train()
    turns = [t for e in episodes for t in e.turns]
    parts = world.gather_json({"won": [e.won for e in episodes], "games": [e.outcome() for e in episodes],
                               "format_errors": [t.error in FORMAT_ERRORS for t in turns]}, "all_gather of eval games")
    won, errors = [w for p in parts for w in p["won"]], [f for p in parts for f in p["format_errors"]]
    return {"win_rate": float(np.mean(won)),
            "format_error_rate": float(np.mean(errors)) if errors else 0.0,
            "games": interleave([p["games"] for p in parts])}


def load_data(cfg: SFTConfig):
    folder = Path(display_path(resolve_path(cfg, cfg.data.folder).resolve()))   # messages name it as the user would
    train = read_sft_jsonl(folder / "train.jsonl")
    valid = read_sft_jsonl(folder / "valid.jsonl") if cfg.validation.every else []
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


def prepare_batches(cfg: SFTConfig, tokenizer, prompt: PromptConfig, data_dir: Path, train_records: list,
                    valid_records: list, world) -> tuple[list, list, bool]:
    """(this rank's train batches, its validation batches, whether any rank has validation batches)."""
    train_seqs = with_boards(tokenize(train_records, tokenizer, data_dir / "train.jsonl"), train_records)
    letters = letter_loss(cfg.decode, cfg.train_free, tokenizer, prompt, train_seqs, data_dir / "train.jsonl")
    valid_seqs = with_boards(tokenize(valid_records, tokenizer, data_dir / "valid.jsonl"), valid_records)
    if letters is not None and valid_seqs:
        letter_loss(cfg.decode, cfg.train_free, tokenizer, prompt, valid_seqs, data_dir / "valid.jsonl")
    valid = make_batches(valid_seqs, cfg, None, letters) if valid_records else []
    if cfg.validation.batches and cfg.validation.batches < len(valid):
        # batches are sorted by length: take them evenly across lengths, not just the shortest (empty boards)
        picks = np.unique(np.linspace(0, len(valid) - 1, cfg.validation.batches).round().astype(int))
        valid = [valid[i] for i in picks]
    return make_batches(train_seqs, cfg, world, letters), world.shard(valid), bool(valid)


def sft_task(cfg: SFTConfig, model, tokenizer, optimizer, prompt: PromptConfig, batches: tuple, world) -> Task:
    """One SFT step: the next batch's token-mean cross-entropy gradient, all-reduced over the ranks."""
    train_batches, valid_batches, has_valid = batches
    loss_and_grad = nn.value_and_grad(model, loss_sum)
    data = {"data_position": 0}

    def step(at: int) -> dict:
        mx.random.seed(cfg.run.seed * 1_000_003 + at + world.rank * 15_485_863)   # dropout masks differ per rank
        start = time.perf_counter()
        batch = train_batches[batch_at(data["data_position"], len(train_batches), cfg.run.seed)]
        data["data_position"] += 1
        grads, total, count, length = mean_gradient(model, loss_and_grad, [batch], world)
        loss = total / count
        grad_norm, applied = apply_update(model, optimizer, grads, cfg.optimizer.max_grad_norm, loss)
        seconds = time.perf_counter() - start
        return {"loss": loss, "grad_norm": grad_norm, "applied": applied, "tokens": length,
                "target_tokens": int(count), "tokens_per_second": length / seconds,
                "peak_memory_gb": mx.get_peak_memory() / 1e9}

    def validate(at: int) -> dict | None:
        if not (has_valid or cfg.validation.games):
            return None
        record = {}
        if has_valid:
            model.eval()
            record["val_loss"] = evaluate_loss(model, valid_batches, world)
            model.train()
        if cfg.validation.games:
            record.update(game_eval(model, tokenizer, cfg, prompt, world))
        return record

    def restore(state: dict) -> None:
        data["data_position"] = int(state["data_position"])

    model.train()
    return Task(kinds=("sft", "sft_valid"), step=step, validate=validate, state=lambda: dict(data), restore=restore,
                info=lambda r: f"loss {r['loss']:.3f}  {r['tokens_per_second']:.0f} tok/s")


def run(cfg: SFTConfig) -> dict:
    world = init_world()                 # under mlx.launch: this rank's share of every batch; else a group of one
    world.check_divisible(cfg.data.batch_size, "data.batch_size")
    run_dir = open_run(cfg, world)          # a run folder in the way is refused before anything loads
    data_dir, train_records, valid_records, prompt = load_data(cfg)
    model, tokenizer, adapter_cfg, trainable = load_policy(cfg, prompt, cfg.decode, cfg.train_free)
    if world.is_main:
        warn_if_over_working_set("sft", cfg)     # one line on stderr when the plan exceeds this machine's memory
    batches = prepare_batches(cfg, tokenizer, prompt, data_dir, train_records, valid_records, world)
    optimizer, schedule = make_optimizer(cfg.optimizer, cfg.run.steps)
    task = sft_task(cfg, model, tokenizer, optimizer, prompt, batches, world)
    task.run_fields = {"trainable_parameters": trainable, "train_batches": len(batches[0])}
    task.saved_paths = {"data.folder": data_dir, "model.adapter": start_adapter(cfg)}
    task.describe = (f"{len(train_records)} examples in {len(batches[0])} batches, {trainable / 1e6:.2f}M "
                     "trainable parameters")
    return train(cfg, task, run_dir, model, optimizer, schedule, adapter_cfg, world)
