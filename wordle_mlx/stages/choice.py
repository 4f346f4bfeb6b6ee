"""`wordle-mlx choice`: SFT data labelled with the fitting word the model itself likes best (expert iteration).

The teacher's labels (`wordle-mlx data`) are the best-splitting candidate, an arbitrary word from the model's
point of view, and a 270M model on a CPU budget does not fit them: session 9's DAgger round won 29 of 320
*train* secrets, whose boards were all in its data. Any answer that fits the clues is a good move (hard-mode
play with consistent answers wins nearly every game), so this stage keeps the rule and changes the label: on
each board the target is the candidate answer (the answers consistent with the feedback, as the teacher uses)
to which the model gives the highest sequence log-probability (`llm/candidate_scores.py`, prompt run once per
board). Optionally the empty board's label is a given `opener` (e.g. the teacher's), since it decides every
game's tree and a weak labeller's favourite can be a poor first guess. The boards are those of self-play with
that rule from the empty board over the split's secrets (train for train, valid for valid, never test), so the
data follows the path the model will take once it plays its labels. This is rejection-sampling fine-tuning
(expert iteration) with the samples replaced by exact scores of every fitting answer. Each distinct example
appears min(traffic, `traffic_cap`) times (traffic: how many secrets' games pass through it), and
`retry_fraction` of them get one more copy whose prompt reports a made-up invalid previous reply, as `data`
does. With `own_retries` the model also decodes every board greedily, and where its reply is a non-word the
board appears again (as often as the board itself) with the prompt the game would show next: that word
rejected ("XXXXX is not in the word list. Try again.", or as `prompt.rejected_word` shows it), and the same
label; with 2, a second non-word on that prompt gives one more. A model told its own word is not a word mostly says it again (session 25). Records use
`data`'s chat JSONL schema (meta mode `self_choice`) and pass its replay check before anything is written.
"""

from __future__ import annotations

import json
import random
import time
from collections import Counter

from pydantic import Field, field_validator

from ..config import MODEL_SPEC_HELP, StrictModel, resolve_path
from ..errors import UserError
from ..game.feedback import feedback
from ..game.solver import Solver
from ..game.splits import split_answers
from ..game.state import MAX_GUESSES, check_guess
from ..game.words import answers
from ..llm.prompts import PromptConfig, build_messages, choose_prompt, format_reply
from ..progress import console, progress_bar
from .dagger import played_secrets
from .data import invalid_reply, teacher_guess, write_checked_sft
from .entropy import load_table


class ChoiceConfig(StrictModel):
    model: str = Field("builtin:gemma-3-270m", description=MODEL_SPEC_HELP)
    adapter: str | None = Field(None, description="LoRA adapter folder of the model whose choices label the data.")
    dtype: str | None = None
    out: str = Field(..., description="Output folder for train.jsonl, valid.jsonl and stats.json.")
    train_games: int | None = Field(None, ge=1, description="Train secrets played (None: the whole train split).")
    valid_games: int | None = Field(None, ge=1, description="Valid secrets played (None: the whole valid split).")
    traffic_cap: int = Field(8, ge=1, description="Each distinct example appears min(traffic, cap) times.")
    retry_fraction: float = Field(0.1, ge=0, le=1, description="Share of distinct examples that also appear once "
                                  "after a made-up invalid reply.")
    prompt: PromptConfig | None = Field(None, description="Prompt settings (None: the adapter's, else the default).")
    opener: str | None = Field(None, description="Label of the empty board, so every game's first guess (an answer "
                               "word); None: the fitting answer the model scores highest, as on every other board.")
    own_retries: int = Field(0, ge=0, le=2, description=(
        "Rounds of retry examples built from the model's own greedy non-words (0: none; 1: after its first "
        "reply on a board; 2: also after its reply to that retry prompt, when that is another non-word). Session 25: "
        "one SFT pass with them (45 -> 55) did no better than without (57), and the model still repeats its "
        "rejected word (docs/RESULTS.md)."))
    score_chunk: int = Field(32, ge=1, description="Candidate replies scored per forward pass.")
    seed: int = Field(0, ge=0, lt=2 ** 32, description="Which secrets are played and the retry examples.")
    progress: bool = True

    @field_validator("opener")
    @classmethod
    def _opener_is_an_answer(cls, word: str | None) -> str | None:
        problem = None if word is None else check_guess(word, answers(), "answer list")
        if problem:
            raise ValueError(f"{problem} (the empty board's label must be a fitting answer)")
        return word


class ChoiceLabeler:
    """The label for a board: its only candidate, the fixed opener on the empty board when one is given, or the
    candidate reply the model scores highest (memoised)."""

    def __init__(self, model, tokenizer, solver: Solver, prompt: PromptConfig, chunk: int, opener: str | None = None):
        self.model, self.tokenizer, self.solver, self.prompt, self.chunk = model, tokenizer, solver, prompt, chunk
        self.memo: dict[tuple, tuple[str, int, float | None]] = {}
        if opener is not None:
            self.memo[()] = (opener, len(solver.table.answers), None)
        self.scored_replies = 0

    def messages(self, history: list[tuple[str, str]], last_error=None) -> list[dict]:
        return build_messages(self.prompt, history, (), MAX_GUESSES, last_error=last_error)

    def reply(self, word: str) -> str:
        return format_reply(None, word, False, self.prompt.guess_format)

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
                from ..llm.candidate_scores import reply_logprobs, reply_token_ids

                messages = self.messages(list(history))
                prompt_ids = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
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


def own_retry_records(records: list[dict], model, tokenizer, prompt: PromptConfig, allowed: frozenset,
                      rounds: int, batch: int = 64, generate_fn=None) -> tuple[list[dict], dict]:
    """Retry examples from the model's own greedy non-words on the boards of `records` (made-up retries are
    left out). Each distinct board is decoded greedily; a non-word reply W gives the record with the prompt
    the game shows next (W rejected) and the board's label, repeated as often as the board is in `records`;
    with `rounds` 2 that prompt is decoded too, and a non-word other than W gives one more (a prompt that two
    records label differently keeps the first one's label). Returns the new records and counts (prompts
    decoded, non-words, records made, per round). `generate_fn` (token-id prompts, SamplingConfig) ->
    completions replaces mlx-lm batching (tests script the replies)."""
    from ..llm.generation import BatchedGenerator, SamplingConfig
    from ..llm.prompts import NOT_A_WORD, parse_reply

    boards: dict[str, list] = {}                 # prompt text -> [record, copies]
    for r in records:
        if "retry_error" not in r["meta"]:
            key = json.dumps(r["messages"][:-1])
            boards.setdefault(key, [r, 0])[1] += 1
    generate = generate_fn or BatchedGenerator(model, tokenizer)
    sampling = SamplingConfig(temperature=0.0, max_tokens_per_turn=16)

    def greedy_words(message_lists: list[list[dict]]) -> list:
        ids = [tokenizer.apply_chat_template(m, add_generation_prompt=True) for m in message_lists]
        out = [c for i in range(0, len(ids), batch) for c in generate(ids[i:i + batch], sampling)]
        return [parse_reply(c.text, prompt.require_think, allowed) for c in out]

    new, counts = [], {"boards": len(boards), "rounds": []}
    pending = [(record, copies, None) for record, copies in boards.values()]   # (record, copies, rejected)
    for _ in range(rounds):
        parsed = greedy_words([p[0]["messages"][:-1] for p in pending]) if pending else []
        made, nxt = 0, []
        for (record, copies, rejected), reply in zip(pending, parsed):
            if reply.error != NOT_A_WORD or reply.guess == rejected:
                continue
            meta = record["meta"]
            history = [(g, feedback(g, meta["secret"])) for g in meta["history"]]
            error = (NOT_A_WORD, reply.guess)
            messages = build_messages(prompt, history, (), MAX_GUESSES, last_error=error) + [record["messages"][-1]]
            retry = {"messages": messages, "meta": {**meta, "retry_error": list(error), "retry_source": "own"}}
            new.extend([retry] * copies)
            nxt.append((retry, copies, reply.guess))
            made += copies
        counts["rounds"].append({"prompts": len(pending), "non_words": len(nxt), "records": made})
        pending = nxt
    return new, counts


def run(cfg: ChoiceConfig) -> dict:
    from ..llm.models import load_model

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
    labeler = ChoiceLabeler(model, tokenizer, solver, prompt, cfg.score_chunk, cfg.opener)
    allowed = frozenset(solver.table.guesses)
    teacher_memo: dict[tuple, str] = {}

    data, stats = {}, {"model": cfg.model, "adapter": cfg.adapter, "seed": cfg.seed, "prompt": prompt.model_dump(),
                       "traffic_cap": cfg.traffic_cap, "retry_fraction": cfg.retry_fraction, "opener": cfg.opener}
    for split, secrets in played_secrets(cfg, splits).items():
        assert not set(secrets) & set(splits["test"]), "choice secrets overlap the test split"
        t0 = time.monotonic()
        with progress_bar(f"choice {split}", len(secrets), enabled=cfg.progress) as advance:
            examples, traffic, games = self_play(secrets, labeler, advance)
        rng = random.Random(f"wordle-mlx-choice|{cfg.seed}|{split}")
        data[split] = weighted_records(examples, traffic, cfg, labeler, rng)
        if cfg.own_retries:
            retries, own_counts = own_retry_records(data[split], model, tokenizer, prompt, allowed, cfg.own_retries)
            data[split] += retries
            random.Random(f"wordle-mlx-own-retries|{split}").shuffle(data[split])
        agree = 0
        for record in examples.values():
            meta = record["meta"]
            key = tuple(meta["history"] + [meta["secret"]])
            if key not in teacher_memo:
                history = [(g, feedback(g, meta["secret"])) for g in meta["history"]]
                teacher_memo[key] = teacher_guess(solver, solver.candidate_columns(history), 100000)
            agree += teacher_memo[key] == meta["target"]
        lengths = Counter(len(g) for g in games)
        won = [len(g) for s, g in zip(secrets, games) if s in g]
        stats[split] = {
            "games": len(games), "self_play_wins": len(won),
            "mean_guesses_on_wins": round(sum(won) / max(1, len(won)), 3),
            "game_length_histogram": {str(k): lengths.get(k, 0) for k in range(1, MAX_GUESSES + 1)},
            "distinct_examples": len(examples), "records": len(data[split]),
            "retry_records": sum("retry_error" in r["meta"] for r in data[split]),
            **({"own_retries": own_counts} if cfg.own_retries else {}),
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
    return {"out": str(out), **stats}
