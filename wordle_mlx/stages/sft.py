"""`wordle-mlx sft`: LoRA supervised fine-tuning on the teacher's data, with the shared trainer.

Reads `train.jsonl`/`valid.jsonl` from `wordle-mlx data`, renders each record with the tokenizer's chat template
(exactly what the rollout engine feeds the model) and trains LoRA adapters (mlx-lm's layers; the base is frozen):
cross-entropy on assistant tokens only, projected onto the vocabulary only at those positions
(`llm/training/sft_loss.py`), one batch of length-sorted examples a step, drawn in a fresh shuffled order every
epoch (`SFTBatches`, the iterator the trainer steps through). `decode` picks the loss: the full loss (free), the
reply's letters as choices among the 26 letter tokens (grammar), or among the letters that continue an allowed
word off the board (words), with `train_free` adding the full loss of every reply token; the adapter records which,
and eval, play and export default to it. Every `validation.every` steps it logs the validation loss and plays
`validation.games` valid-split words greedily (`llm/play/games.py`, as eval and GRPO do). The run folder,
checkpoints, resume, metrics and stop signals are the trainer's (`llm/training/trainer.py`); a checkpoint carries
the data position, and the dropout RNG is re-seeded from (seed, step) every step, so a resumed run computes what
an uninterrupted one would.
"""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx
import numpy as np

from ..config import display_path, read_json_file, resolve_path
from ..errors import UserError
from ..game.splits import split_words
from ..game.words import guess_list
from ..llm.play.games import validation_record
from ..llm.play.prompts import PromptConfig, system_prompt
from ..llm.play.rollout import GameSpec, RolloutConfig
from ..llm.training.distributed import init_world
from ..llm.training.policy import load_policy, start_adapter
from ..llm.training.run_folder import open_run, training_args
from ..llm.training.sft_loss import LetterLoss, SFTBatch, letter_loss, loss_sum, make_batch
from ..llm.training.trainer import Batch, make_optimizer, train
from ..llm.training.sft_data import read_sft_jsonl
from ..planning.stage_plan import warn_if_over_working_set
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


def make_batches(seqs: list[tuple], batch_size: int, pad_to: int, max_seq_length: int, world=None,
                 letters: LetterLoss | None = None) -> list[SFTBatch | None]:
    """Length buckets: examples sorted by length, cut into batches of `batch_size` (the last may be smaller).
    With several ranks each global batch is split: a rank keeps its examples rank, rank + size, ... of it
    (None when a short last batch leaves it none). `letters`: the grammar or words loss."""
    rank, size = (world.rank, world.size) if world is not None else (0, 1)
    order = sorted(range(len(seqs)), key=lambda i: (len(seqs[i][0]), i))
    shares = [order[s:s + batch_size][rank::size] for s in range(0, len(order), batch_size)]
    extra = {} if letters is None else {"letter_ids": letters.letter_ids, "trie": letters.trie,
                                        "train_free": letters.train_free}
    return [make_batch([(*seqs[i][:2], seqs[i][2] if len(seqs[i]) > 2 and seqs[i][2] else ()) for i in mine],
                       pad_to, max_seq_length, True, **extra) if mine else None for mine in shares]


def batch_at(position: int, n_batches: int, seed: int) -> int:
    """Which batch is the `position`-th one drawn: a fresh shuffle of all batches every epoch."""
    epoch, offset = divmod(position, n_batches)
    return int(np.random.default_rng([seed, epoch]).permutation(n_batches)[offset])


class SFTBatches:
    """The trainer's data: one batch a step (`batch_at`), with every rank's target tokens as its count. Before
    each step it seeds MLX's RNG from (seed, step, rank), so dropout masks differ per rank and a resumed run draws
    what an uninterrupted one would; its state is the data position."""

    def __init__(self, batches: list[SFTBatch | None], seed: int, world):
        self.batches, self.seed, self.world, self.position = batches, seed, world, 0

    def __iter__(self):
        return self

    def __next__(self) -> Batch:
        step = self.position + 1
        mx.random.seed(self.seed * 1_000_003 + step + self.world.rank * 15_485_863)
        batch = self.batches[batch_at(self.position, len(self.batches), self.seed)]
        self.position += 1
        count, length = self.world.sum_floats([batch.tokens, batch.length] if batch is not None else [0, 0])
        return Batch([batch.loss_args()] if batch is not None else [], count,
                     {"tokens": int(length), "target_tokens": int(count)})

    def state(self) -> dict:
        return {"data_position": self.position}

    def restore(self, state: dict) -> None:
        self.position = int(state["data_position"])


def sft_loss(model, *args):
    """The trainer's loss: the summed cross-entropy of a batch (the trainer divides by its target tokens)."""
    total, _count = loss_sum(model, *args)
    return total, {}


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


def load_data(folder: Path, with_valid: bool):
    """(train records, valid records, the prompt the data was made with) of a `wordle-mlx data` folder."""
    train = read_sft_jsonl(folder / "train.jsonl")
    valid = read_sft_jsonl(folder / "valid.jsonl") if with_valid else []
    stats = folder / "stats.json"
    if stats.is_file():
        return train, valid, PromptConfig(**read_json_file(stats)["prompt"])
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
    return train, valid, prompt


def prepare_batches(data, decode: str, train_free: bool, valid_batches: int, tokenizer, prompt: PromptConfig,
                    data_dir: Path, train_records: list, valid_records: list, world) -> tuple[list, list]:
    """(this rank's train batches, its validation batches); `data` is the config's data section."""
    train_seqs = with_boards(tokenize(train_records, tokenizer, data_dir / "train.jsonl"), train_records)
    letters = letter_loss(decode, train_free, tokenizer, prompt, train_seqs, data_dir / "train.jsonl")
    valid_seqs = with_boards(tokenize(valid_records, tokenizer, data_dir / "valid.jsonl"), valid_records)
    if letters is not None and valid_seqs:
        letter_loss(decode, train_free, tokenizer, prompt, valid_seqs, data_dir / "valid.jsonl")
    shape = (data.batch_size, data.pad_to, data.max_seq_length)
    valid = make_batches(valid_seqs, *shape, None, letters) if valid_records else []
    if valid_batches and valid_batches < len(valid):
        # batches are sorted by length: take them evenly across lengths, not just the shortest (empty boards)
        picks = np.unique(np.linspace(0, len(valid) - 1, valid_batches).round().astype(int))
        valid = [valid[i] for i in picks]
    return make_batches(train_seqs, *shape, world, letters), world.shard(valid)


def sft_evaluate(model, tokenizer, valid_batches: list, games: int, rollout: RolloutConfig, world):
    """The validation of a step: the loss on the validation batches, and `games` valid-split words played."""
    specs = {"empty": [GameSpec(w) for w in split_words("valid")[:games]]}
    has_loss = bool(world.sum_floats([len(valid_batches)])[0])

    def evaluate(step: int) -> dict | None:
        if not (has_loss or games):
            return None
        record = {}
        if has_loss:
            model.eval()
            record["val_loss"] = evaluate_loss(model, valid_batches, world)
        if games:
            record.update(validation_record(model, tokenizer, specs, rollout, set(guess_list()), world))
        model.train()
        return record

    return evaluate


def run(cfg: SFTConfig) -> dict:
    world = init_world()                 # under mlx.launch: this rank's share of every batch; else a group of one
    world.check_divisible(cfg.data.batch_size, "data.batch_size")
    run_dir = open_run(cfg, world)          # a run folder in the way is refused before anything loads
    data_dir = Path(display_path(resolve_path(cfg, cfg.data.folder).resolve()))   # messages name it as the user would
    train_records, valid_records, prompt = load_data(data_dir, bool(cfg.validation.every))
    model, tokenizer, adapter_cfg, trainable = load_policy(cfg.model, cfg.lora, cfg.run.seed, start_adapter(cfg),
                                                           prompt, cfg.decode, cfg.train_free)
    if world.is_main:
        warn_if_over_working_set("sft", cfg)     # one line on stderr when the plan exceeds this machine's memory
    train_batches, valid_batches = prepare_batches(cfg.data, cfg.decode, cfg.train_free, cfg.validation.batches,
                                                   tokenizer, prompt, data_dir, train_records, valid_records, world)
    optimizer, schedule = make_optimizer(cfg.optimizer, cfg.run.steps)
    rollout = RolloutConfig(prompt=prompt, max_tokens_per_turn=cfg.max_tokens,
                            **({"decode": "words"} if cfg.decode == "words" else {}))
    args = training_args(
        cfg, run_dir, adapter_cfg, {"data.folder": data_dir, "model.adapter": start_adapter(cfg)}, schedule,
        describe=f"{len(train_records)} examples in {len(train_batches)} batches, {trainable / 1e6:.2f}M trainable "
                 "parameters",
        progress_text=lambda r: f"loss {r['loss']:.3f}  {r['tokens_per_second']:.0f} tok/s",
        run_fields={"trainable_parameters": trainable, "train_batches": len(train_batches)})
    model.train()
    evaluate = sft_evaluate(model, tokenizer, valid_batches, cfg.validation.games, rollout, world)
    return train(model, optimizer, sft_loss, SFTBatches(train_batches, cfg.run.seed, world), args, evaluate,
                 world=world)
