"""`wordle-mlx data self-play`: exact reply scores (whole replies, grammar and words decoding's letters), labels that
are the model's best fitting answer, checked data."""

from __future__ import annotations

import json
import random
import tempfile
import unittest
from collections import Counter
from pathlib import Path

import mlx.core as mx
import numpy as np

from tests.test_rollout import tiny
from wordle_mlx.config import load_config
from wordle_mlx.errors import UserError
from wordle_mlx.game.feedback import feedback
from wordle_mlx.game.knowledge import is_consistent
from wordle_mlx.game.solver import Solver
from wordle_mlx.game.splits import split_answers
from wordle_mlx.llm.play.candidate_scores import letter_logprobs, reply_logprobs, reply_token_ids
from wordle_mlx.llm.play.prompts import PromptConfig
from wordle_mlx.game.words import guess_list
from wordle_mlx.llm.play.reply_grammar import LETTERS, LetterGrammar, WordTrie
from wordle_mlx.llm.training.sft_data import replay_problem
from wordle_mlx.stages import choice
from wordle_mlx.stages.pattern_table import load_table

PROMPT = PromptConfig(require_think=False, context="summary", style="compact", guess_format="letters")


def full_forward_logprob(model, prompt_ids: list[int], reply: list[int]) -> float:
    """Oracle: the whole sequence through the model once, log-softmax, the reply tokens' entries summed."""
    seq = mx.array([prompt_ids + reply])
    logp = np.array(mx.log(mx.softmax(model(seq)[0].astype(mx.float32), axis=-1)), dtype=np.float64)
    return float(sum(logp[len(prompt_ids) - 1 + t, tok] for t, tok in enumerate(reply)))


class ReplyLogprobsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.model, cls.tok = tiny()
        cls.messages = [{"role": "system", "content": "Wordle"}, {"role": "user", "content": "Pattern: _ a _ _ _"}]
        cls.prompt = [int(t) for t in cls.tok.apply_chat_template(cls.messages, add_generation_prompt=True)]

    def test_scores_equal_a_full_forward_pass_for_replies_of_different_lengths(self):
        replies = [reply_token_ids(self.tok, self.messages, text) for text in
                   ("<guess> c r a n e</guess>", "<guess>water</guess>", "hm", "<guess> s l a t e</guess> ok")]
        self.assertGreater(len(set(map(len, replies))), 1)
        got = reply_logprobs(self.model, self.prompt, replies, chunk=3)      # two chunks, padded rows
        want = [full_forward_logprob(self.model, self.prompt, r) for r in replies]
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-3)

    def test_replies_with_a_common_start_score_it_once_and_exactly(self):
        texts = ["<guess> c r a n e</guess>", "<guess> c r a t e</guess>", "<guess> s l a t e</guess>",
                 "<guess> c r a n e</guess> !"]
        replies = [reply_token_ids(self.tok, self.messages, t) for t in texts]
        got = reply_logprobs(self.model, self.prompt, replies, chunk=2)
        want = [full_forward_logprob(self.model, self.prompt, r) for r in replies]
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-3)

    def test_reply_tokens_are_what_the_template_appends(self):
        reply = "<guess> c r a n e</guess>"
        ids = reply_token_ids(self.tok, self.messages, reply)
        full = self.tok.apply_chat_template(self.messages + [{"role": "assistant", "content": reply}])
        self.assertEqual(self.prompt + ids, [int(t) for t in full])
        self.assertIn("crane", self.tok.decode(ids).replace(" ", ""))

    def test_bad_inputs_raise(self):
        with self.assertRaisesRegex(ValueError, "at least one token"):
            reply_logprobs(self.model, self.prompt, [[]])
        with self.assertRaisesRegex(ValueError, "at least 2 tokens"):
            reply_logprobs(self.model, self.prompt[:1], [[5]])


def grammar_logprob(model, grammar, prompt_ids: list[int], word: str, board: list[str] | None = None) -> float:
    """Oracle for grammar scoring: the whole reply through the model once, and at each letter the full
    log-softmax masked to the 26 letter tokens and renormalised; forced tokens add nothing. With `board`, words
    decoding's: masked to the letters that continue an allowed word not on the board (brute force over the list)."""
    tokens, is_letter = grammar.reply([LETTERS.index(c) for c in word])
    logits = np.array(model(mx.array([prompt_ids + tokens]))[0].astype(mx.float32), dtype=np.float64)
    letters = logits[:, grammar.letter_ids]
    total, written = 0.0, ""
    for t, (tok, c) in enumerate(zip(tokens, is_letter)):
        if not c:
            continue
        row = letters[len(prompt_ids) - 1 + t]
        if board is not None:
            nexts = {w[len(written)] for w in guess_list() if w.startswith(written) and w not in board}
            row = np.where([x in nexts for x in LETTERS], row, -np.inf)
        total += float(row[grammar.index_of[tok]] - row.max() - np.log(np.exp(row - row.max()).sum()))
        written += LETTERS[grammar.index_of[tok]]
    return total


class LetterLogprobsTest(unittest.TestCase):
    def test_letter_scores_equal_the_full_model_renormalised_over_the_letters(self):
        model, tok = tiny()
        grammar = LetterGrammar.for_tokenizer(tok)
        messages = [{"role": "system", "content": "Wordle"}, {"role": "user", "content": "Pattern: _ a _ _ _"}]
        prompt = [int(t) for t in tok.apply_chat_template(messages, add_generation_prompt=True)]
        words = ["crane", "water", "slate", "zzzzz", "crate"]
        got = letter_logprobs(model, prompt, words, grammar, chunk=2)          # three chunks
        want = [grammar_logprob(model, grammar, prompt, w) for w in words]
        # 5 float32 log-softmax terms of magnitude about 3: a few float32 ulps of the sum
        np.testing.assert_allclose(got, want, rtol=0, atol=160 * np.finfo(np.float32).eps)
        self.assertTrue(np.all(got < 0))
        with self.assertRaisesRegex(ValueError, "5 lowercase letters"):
            letter_logprobs(model, prompt, ["cran"], grammar)


class ChoiceLabelTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.model, cls.tok = tiny()
        cls.solver = Solver(load_table(show_progress=False))
        cls.labeler = choice.ChoiceLabeler(cls.model, cls.tok, cls.solver, PROMPT, chunk=16)

    def test_label_is_the_fitting_answer_with_the_highest_score(self):
        secret = split_answers()["train"][5]
        history = [(g, feedback(g, secret)) for g in ("slate", "crony")]
        word, n, logprob = self.labeler.label(history)
        cands = [self.solver.table.answers[c] for c in self.solver.candidate_columns(history)]
        self.assertEqual(n, len(cands))
        self.assertGreater(n, 1, "pick a board with several candidates")
        self.assertIn(word, cands)
        self.assertTrue(is_consistent(word, history))
        # each candidate scored on its own, through the oracle
        messages = self.labeler.messages(history)
        prompt = [int(t) for t in self.tok.apply_chat_template(messages, add_generation_prompt=True)]
        scores = {w: full_forward_logprob(self.model, prompt, reply_token_ids(self.tok, messages, self.labeler.reply(w)))
                  for w in cands}
        self.assertAlmostEqual(logprob, scores[word], delta=1e-3)
        self.assertGreaterEqual(logprob, max(scores.values()) - 1e-3)

    def test_grammar_labels_are_the_best_candidate_by_letter_scores(self):
        secret = split_answers()["train"][5]
        history = [(g, feedback(g, secret)) for g in ("slate", "crony")]
        grammar = LetterGrammar.for_tokenizer(self.tok)
        labeler = choice.ChoiceLabeler(self.model, self.tok, self.solver, PROMPT, chunk=16, grammar=grammar)
        word, n, logprob = labeler.label(history)
        cands = [self.solver.table.answers[c] for c in self.solver.candidate_columns(history)]
        messages = labeler.messages(history)
        prompt = [int(t) for t in self.tok.apply_chat_template(messages, add_generation_prompt=True)]
        scores = {w: grammar_logprob(self.model, grammar, prompt, w) for w in cands}
        self.assertEqual(n, len(cands))
        self.assertAlmostEqual(logprob, scores[word], delta=1e-4)
        self.assertGreaterEqual(logprob, max(scores.values()) - 1e-4)

    def test_words_labels_are_the_best_candidate_by_words_decoding_scores(self):
        """decode words: a candidate's score is its letters under words decoding's policy (allowed words off the
        board), which differs from grammar's, and the label is the candidate it scores highest."""
        secret = split_answers()["train"][5]
        history = [(g, feedback(g, secret)) for g in ("slate", "crony")]
        grammar = LetterGrammar.for_tokenizer(self.tok)
        labeler = choice.ChoiceLabeler(self.model, self.tok, self.solver, PROMPT, chunk=16, grammar=grammar,
                                       trie=WordTrie(guess_list()))
        word, n, logprob = labeler.label(history)
        cands = [self.solver.table.answers[c] for c in self.solver.candidate_columns(history)]
        messages = labeler.messages(history)
        prompt = [int(t) for t in self.tok.apply_chat_template(messages, add_generation_prompt=True)]
        scores = {w: grammar_logprob(self.model, grammar, prompt, w, ["slate", "crony"]) for w in cands}
        letters_only = {w: grammar_logprob(self.model, grammar, prompt, w) for w in cands}
        # 5 float32 log-softmax terms: a few ulps of the largest letter logit each
        logits = np.array(self.model(mx.array([prompt]))[0].astype(mx.float32))[:, grammar.letter_ids]
        tol = 5 * 8 * np.finfo(np.float32).eps * max(1.0, float(np.abs(logits).max()))
        self.assertEqual(n, len(cands))
        self.assertAlmostEqual(logprob, scores[word], delta=tol)
        self.assertGreaterEqual(logprob, max(scores.values()) - tol)
        self.assertTrue(all(scores[w] >= letters_only[w] - tol for w in cands))   # fewer letters share the mass
        self.assertTrue(any(scores[w] > letters_only[w] + 1e3 * tol for w in cands))

    def test_one_candidate_is_its_own_label_without_scoring(self):
        secret = split_answers()["train"][7]
        history = [(g, feedback(g, secret)) for g in self.solver.play(secret)[:-1]]
        cols = self.solver.candidate_columns(history)
        if len(cols) != 1:
            self.skipTest("the solver's last board had several candidates")
        before = self.labeler.scored_replies
        self.assertEqual(self.labeler.label(history), (secret, 1, None))
        self.assertEqual(self.labeler.scored_replies, before)

    def test_self_play_follows_the_labels_and_counts_traffic(self):
        secrets = split_answers()["train"][:6]
        examples, traffic, games = choice.self_play(secrets, self.labeler)
        self.assertEqual(sum(traffic.values()), sum(len(g) for g in games))
        for secret, guesses in zip(secrets, games):
            self.assertEqual(len(set(guesses)), len(guesses))
            for i, guess in enumerate(guesses):
                history = [(g, feedback(g, secret)) for g in guesses[:i]]
                self.assertEqual(guess, self.labeler.label(history)[0])
                self.assertTrue(is_consistent(guess, history))
        # every game opens with the empty board's label, so that example's traffic is the number of games
        opener = [k for k, r in examples.items() if not r["meta"]["history"]]
        self.assertEqual(len(opener), 1)
        self.assertEqual(traffic[opener[0]], len(secrets))
        cfg = choice.ChoiceConfig(out="unused", traffic_cap=3, retry_fraction=0.5)
        records = choice.weighted_records(examples, traffic, cfg, self.labeler, random.Random(0))
        plain = Counter(json.dumps(r["messages"]) for r in records if "retry_error" not in r["meta"])
        self.assertEqual(plain, Counter({k: min(t, 3) for k, t in traffic.items()}))
        retries = [r for r in records if "retry_error" in r["meta"]]
        self.assertTrue(retries)
        for r in retries:
            self.assertIn("Try again.", r["messages"][1]["content"])

    def test_a_given_opener_starts_every_game_and_is_not_scored(self):
        secrets = split_answers()["train"][10:14]
        labeler = choice.ChoiceLabeler(self.model, self.tok, self.solver, PROMPT, chunk=16, opener="crane")
        self.assertEqual(labeler.label([]), ("crane", len(self.solver.table.answers), None))
        self.assertEqual(labeler.scored_replies, 0)
        examples, traffic, games = choice.self_play(secrets, labeler)
        self.assertTrue(all(g[0] == "crane" for g in games))
        # later boards are still labelled by the model's scores, as without an opener
        for secret, guesses in zip(secrets, games):
            if len(guesses) > 1 and "crane" != secret:
                history = [("crane", feedback("crane", secret))]
                self.assertEqual(guesses[1], self.labeler.label(history)[0])


class ChoiceRunTest(unittest.TestCase):
    def test_run_writes_checked_data_from_train_and_valid_secrets_only(self):
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "choice.json"
            path.write_text(json.dumps({"model": "builtin:tiny-random", "out": str(Path(tmp) / "out"),
                                        "train_games": 4, "valid_games": 2, "prompt": PROMPT.model_dump(),
                                        "progress": False}))
            result = choice.run(load_config(path, choice.ChoiceConfig))
            splits = split_answers()
            split_sets = {k: set(v) for k, v in splits.items()}
            allowed = set(Solver(load_table(show_progress=False)).table.guesses)
            for split in ("train", "valid"):
                records = [json.loads(l) for l in (Path(tmp) / "out" / f"{split}.jsonl").read_text().splitlines()]
                self.assertEqual(len(records), result[split]["records"])
                self.assertTrue({r["meta"]["secret"] for r in records} <= set(splits[split]))
                for r in records:
                    self.assertIsNone(replay_problem(r, PROMPT, allowed, split, split_sets))
            self.assertEqual(result["valid"]["games"], 2)
            self.assertEqual(result["decode"], "grammar")     # the default for a letters prompt

    def test_a_think_prompt_is_a_user_error(self):
        with tempfile.TemporaryDirectory() as tmp:
            cfg = choice.ChoiceConfig(model="builtin:tiny-random", out=str(Path(tmp) / "out"), progress=False,
                                      prompt=PROMPT.model_copy(update={"require_think": True}))
            with self.assertRaisesRegex(UserError, "require_think false"):
                choice.run(cfg)
            self.assertFalse((Path(tmp) / "out").exists())

    def test_an_opener_that_is_not_an_answer_is_a_one_line_config_error(self):
        with tempfile.TemporaryDirectory() as tmp:
            for word, why in (("zzzzz", "not in the answer list"), ("cran", "has 4 letters")):
                path = Path(tmp) / "choice.json"
                path.write_text(json.dumps({"out": "out", "opener": word}))
                with self.assertRaises(UserError) as err:
                    load_config(path, choice.ChoiceConfig)
                message = str(err.exception)
                self.assertNotIn("\n", message)
                for part in (str(path), "opener", word, why):
                    self.assertIn(part, message)


if __name__ == "__main__":
    unittest.main()
