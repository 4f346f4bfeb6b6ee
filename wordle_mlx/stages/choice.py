"""`wordle-mlx data self-play`: SFT data labelled with the fitting word the model itself likes best (expert
iteration).

The teacher's labels (`wordle-mlx data`) are the best-splitting candidate, an arbitrary word from the model's point
of view, and a 270M model on a CPU budget does not fit them, even on the boards it reached itself (a DAgger
round; docs/RESULTS.md has the figures). Any answer that fits the clues is a good move
(hard-mode play with consistent answers wins nearly every game), so this stage keeps the rule and changes the
label: on each board the target is the candidate answer (the answers consistent with the feedback, as the teacher
uses) to which the model gives the highest sequence log-probability (`llm/play/candidate_scores.py`, prompt run once per
board): under `decode` grammar (the default) the log-probability of its 5 letters among the 26 letter tokens
(grammar decoding's policy), under words that of its 5 letters each among the letters that continue an allowed word
off the board (words decoding's policy), under free that of the whole reply over the vocabulary. Optionally the
empty board's label is a given `opener` (e.g. the teacher's), since it decides every game's tree and a weak
labeller's favourite can be a poor first guess. The boards are those of self-play with that rule from the empty
board over the split's secrets (train for train, valid for valid, never test), so the data follows the path the
model will take once it plays its labels. This is rejection-sampling fine-tuning (expert iteration) with the
samples replaced by exact scores of every fitting answer. Each distinct example appears min(traffic, `traffic_cap`)
times (traffic: how many secrets' games pass through it), and `retry_fraction` of them get one more copy whose
prompt reports a made-up invalid previous reply, as `data` does. Records use `data`'s chat JSONL schema (meta mode
`self_choice`) and pass its replay check before anything is written.
"""

from __future__ import annotations

import json
import random
import time
from collections import Counter

from ..config import display_path, resolve_path
from ..errors import UserError
from ..game.feedback import feedback
from ..game.solver import Solver
from ..game.splits import split_answers
from ..game.state import MAX_GUESSES
from ..llm.model.models import load_model
from ..llm.play.candidate_scores import letter_logprobs, reply_logprobs, reply_token_ids
from ..llm.play.prompts import PromptConfig, build_messages, choose_prompt, format_reply
from ..llm.play.reply_grammar import LetterGrammar, WordTrie, effective_mode
from ..llm.training.sft_data import invalid_reply, write_checked_sft
from ..runtime.progress import console, progress_bar
from .choice_config import ChoiceConfig
from .pattern_table import load_table


class ChoiceLabeler:
    """The label for a board: its only candidate, the fixed opener on the empty board when one is given, or the
    candidate reply the model scores highest (memoised)."""

    def __init__(self, model, tokenizer, solver: Solver, prompt: PromptConfig, chunk: int, opener: str | None = None,
                 grammar=None, trie=None):
        self.model, self.tokenizer, self.solver, self.prompt, self.chunk = model, tokenizer, solver, prompt, chunk
        self.grammar = grammar               # a LetterGrammar: score letters only (grammar decoding's policy)
        self.trie = trie                     # a WordTrie: and only those words decoding offers (its policy)
        self.memo: dict[tuple, tuple[str, int, float | None]] = {}
        if opener is not None:
            self.memo[()] = (opener, len(solver.table.answers), None)
        self.scored_replies = 0

    def messages(self, history: list[tuple[str, str]], last_error=None) -> list[dict]:
        return build_messages(self.prompt, history, (), MAX_GUESSES, last_error=last_error)

    def reply(self, word: str) -> str:
        return format_reply(None, word, self.prompt.guess_format)

    def label(self, history: list[tuple[str, str]]) -> tuple[str, int, float | None]:
        """(word, number of candidates, its log-probability or None when it was not scored: the only candidate,
        or the given opener)."""
        key = tuple(history)
        if key not in self.memo:
            cols = self.solver.candidate_columns(list(history))
            words = [self.solver.table.answers[c] for c in cols]
            if not words:
                raise ValueError(f"no answer fits the board {history}")
            if len(words) == 1:
                self.memo[key] = (words[0], 1, None)
            else:
                messages = self.messages(list(history))
                prompt_ids = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
                if self.grammar is not None:
                    scores = letter_logprobs(self.model, prompt_ids, words, self.grammar, self.chunk, self.trie,
                                             [g for g, _ in history])
                else:
                    replies = [reply_token_ids(self.tokenizer, messages, self.reply(w), prompt_ids) for w in words]
                    scores = reply_logprobs(self.model, prompt_ids, replies, self.chunk)
                best = int(scores.argmax())          # ties: the first in answer-list order
                self.memo[key] = (words[best], len(words), float(scores[best]))
                self.scored_replies += len(words)
        return self.memo[key]


def self_play(secrets: list[str], labeler: ChoiceLabeler, progress=None) -> tuple[dict[str, dict], Counter, list[list[str]]]:
    """Every secret's game when each move is the board's label: the distinct examples (by chat text, first
    secret that reached it in its meta), their traffic, and each game's guesses."""
    examples: dict[str, dict] = {}
    traffic: Counter = Counter()
    games = []
    for secret in secrets:
        guesses: list[str] = []
        while len(guesses) < MAX_GUESSES and secret not in guesses:
            history = [(g, feedback(g, secret)) for g in guesses]
            word, n_cands, logprob = labeler.label(history)
            messages = labeler.messages(history) + [{"role": "assistant", "content": labeler.reply(word)}]
            key = json.dumps(messages)
            traffic[key] += 1
            examples.setdefault(key, {"messages": messages, "meta": {
                "secret": secret, "history": list(guesses), "seeded": 0, "mode": "self_choice", "target": word,
                "candidates": n_cands, "logprob": None if logprob is None else round(logprob, 4)}})
            guesses.append(word)
        games.append(guesses)
        if progress is not None:
            progress(1)
    return examples, traffic, games


def weighted_records(examples: dict[str, dict], traffic: Counter, cfg: ChoiceConfig, labeler: ChoiceLabeler,
                     rng: random.Random) -> list[dict]:
    """Each distinct example min(traffic, cap) times, plus a retry copy for `retry_fraction` of them, shuffled."""
    records = []
    for key, record in examples.items():
        records.extend([record] * min(traffic[key], cfg.traffic_cap))
        if cfg.retry_fraction and rng.random() < cfg.retry_fraction:
            meta = record["meta"]
            error = invalid_reply(rng, labeler.solver.table)
            history = [(g, feedback(g, meta["secret"])) for g in meta["history"]]
            messages = labeler.messages(history, last_error=error) + [record["messages"][-1]]
            records.append({"messages": messages, "meta": {**meta, "retry_error": list(error)}})
    rng.shuffle(records)
    return records


def secrets_for(split: list[str], n: int, seed: int, name: str) -> list[str]:
    """The first `n` words of a seeded shuffle of one split (the seed string predates this stage's name and is
    kept, so the same config plays the same secrets)."""
    if n > len(split):
        raise UserError(f"self-play: {name}_games {n} is more than the {len(split)} words of the {name} split")
    order = sorted(split)
    random.Random(f"wordle-mlx-dagger|{seed}|{name}").shuffle(order)
    return order[:n]


def played_secrets(cfg, splits: dict[str, list[str]]) -> dict[str, list[str]]:
    """The secrets a self-play round (`cfg`: its config) plays, train then valid: the first `train_games` /
    `valid_games` (None: the whole split) of a seeded shuffle of the split."""
    return {split: secrets_for(splits[split], len(splits[split]) if n is None else n, cfg.seed, split)
            for split, n in (("train", cfg.train_games), ("valid", cfg.valid_games))}


def run(cfg: ChoiceConfig) -> dict:
    out = resolve_path(cfg, cfg.out).resolve()
    adapter = str(resolve_path(cfg, cfg.adapter)) if cfg.adapter else None
    prompt = choose_prompt(cfg.prompt or PromptConfig(), cfg.prompt is not None, adapter)
    if prompt.context != "summary" or prompt.require_think:
        raise UserError(f"choice: prompt must have context 'summary' and require_think false (got context "
                        f"{prompt.context!r}, require_think {prompt.require_think}): labels are bare guesses")
    solver = Solver(load_table(show_progress=cfg.progress))
    splits = split_answers(solver.table.answers)
    model, tokenizer = load_model(cfg.model, adapter_path=adapter, dtype=cfg.dtype)
    model.eval()
    decode = effective_mode(cfg.decode, prompt, "decode" in cfg.model_fields_set)
    grammar = LetterGrammar.for_tokenizer(tokenizer) if decode != "free" else None
    trie = WordTrie(solver.table.guesses) if decode == "words" else None
    labeler = ChoiceLabeler(model, tokenizer, solver, prompt, cfg.score_chunk, cfg.opener, grammar, trie)

    data, stats = {}, {"model": cfg.model, "adapter": display_path(adapter) if adapter else None, "seed": cfg.seed,
                       "prompt": prompt.model_dump(), "decode": decode,
                       "traffic_cap": cfg.traffic_cap, "retry_fraction": cfg.retry_fraction, "opener": cfg.opener}
    for split, secrets in played_secrets(cfg, splits).items():
        assert not set(secrets) & set(splits["test"]), "choice secrets overlap the test split"
        t0 = time.monotonic()
        with progress_bar(f"choice {split}", len(secrets), enabled=cfg.progress) as advance:
            examples, traffic, games = self_play(secrets, labeler, advance)
        rng = random.Random(f"wordle-mlx-choice|{cfg.seed}|{split}")
        data[split] = weighted_records(examples, traffic, cfg, labeler, rng)
        agree = 0
        for record in examples.values():
            meta = record["meta"]
            history = [(g, feedback(g, meta["secret"])) for g in meta["history"]]
            agree += solver.best_candidate(solver.candidate_columns(history)) == meta["target"]   # memoised
        lengths = Counter(len(g) for g in games)
        won = [len(g) for s, g in zip(secrets, games) if s in g]
        stats[split] = {
            "games": len(games), "self_play_wins": len(won),
            "mean_guesses_on_wins": round(sum(won) / max(1, len(won)), 3),
            "game_length_histogram": {str(k): lengths.get(k, 0) for k in range(1, MAX_GUESSES + 1)},
            "distinct_examples": len(examples), "records": len(data[split]),
            "retry_records": sum("retry_error" in r["meta"] for r in data[split]),
            "same_as_teacher": agree, "seconds": round(time.monotonic() - t0, 1)}
    stats["scored_replies"] = labeler.scored_replies
    stats["openers"] = dict(Counter(r["meta"]["target"] for r in data["train"] if not r["meta"]["history"]))

    split_sets = {name: set(words) for name, words in splits.items()}
    write_checked_sft(out, data, stats, prompt, set(solver.table.guesses), split_sets)
    if cfg.progress:
        for split in data:
            s = stats[split]
            console.print(f"choice {split}: self-play won {s['self_play_wins']}/{s['games']}, "
                          f"{s['distinct_examples']} distinct boards ({s['same_as_teacher']} labelled as the teacher "
                          f"would), {s['records']} records")
    return {"out": display_path(out), **stats}
