"""The rollout engine: batching, stopping rules, game rules, log-prob convention (tiny model; one 270M check)."""

from __future__ import annotations

import math
import unittest

import mlx.core as mx
import numpy as np

from wordle_mlx.game.words import guess_list
from wordle_mlx.llm.play.generation import BatchedGenerator, Completion, SamplingConfig, policy_logprobs
from wordle_mlx.llm.model.models import load_model
from wordle_mlx.llm.play.prompts import MISSING_GUESS, NOT_A_WORD, NOT_FIVE_LETTERS, PromptConfig
from wordle_mlx.llm.play.rollout import (GameSpec, RolloutConfig, play_games, policy_logprob_temperature,
                                    prompt_token_ids, sample_replies)

ALLOWED = frozenset(guess_list())
_TINY = None


def tiny():
    global _TINY
    if _TINY is None:
        _TINY = load_model("builtin:tiny-random")
    return _TINY


class Scripted:
    """A generation backend that returns fixed reply texts, call by call (one list per turn batch)."""

    def __init__(self, tokenizer, calls: list[list[str]]):
        self.tokenizer, self.calls, self.prompts = tokenizer, list(calls), []

    def __call__(self, prompts, cfg):
        self.prompts.append([list(p) for p in prompts])
        texts = self.calls.pop(0)
        assert len(texts) == len(prompts), (len(texts), len(prompts))
        out = []
        for text in texts:
            ids = self.tokenizer.encode(text, add_special_tokens=False)
            out.append(Completion(ids, [-0.5] * len(ids), text, "stop"))
        return out


def reply(word: str) -> str:
    return f"<think>try {word}</think>\n<guess>{word}</guess>"


class ScriptedModel:
    """A stand-in model whose next token depends only on the last input token (a fixed table)."""

    def __init__(self, table: dict[int, int], vocab: int, default: int):
        self.table, self.vocab, self.default = table, vocab, default

    def make_cache(self):
        return []

    def eval(self):
        return self

    def __call__(self, inputs, cache=None):
        nxt = [self.table.get(int(t), self.default) for t in inputs[:, -1].tolist()]
        logits = mx.full((inputs.shape[0], self.vocab), -30.0)
        logits[mx.arange(len(nxt)), mx.array(nxt)] = 10.0
        return mx.broadcast_to(logits[:, None, :], (inputs.shape[0], inputs.shape[1], self.vocab))


class TestEngineRules(unittest.TestCase):
    def setUp(self):
        self.tok = tiny()[1]

    def test_win_stops_game(self):
        backend = Scripted(self.tok, [[reply("slate"), reply("crane")], [reply("crane"), reply("brine")]])
        eps = play_games(None, self.tok, [GameSpec("crane"), GameSpec("brine")], RolloutConfig(), ALLOWED,
                         generate_fn=backend)
        self.assertTrue(eps[0].won and eps[1].won)
        self.assertEqual(eps[0].state.guesses, ["slate", "crane"])
        self.assertEqual(eps[1].state.guesses, ["crane", "brine"])
        self.assertEqual([len(b) for b in backend.prompts], [2, 2])
        self.assertEqual(eps[0].turns[0].pattern, "XXGXG")
        self.assertTrue(eps[0].turns[1].consistent)

    def test_finished_game_leaves_the_batch(self):
        backend = Scripted(self.tok, [[reply("crane"), reply("slate")], [reply("brine")]])
        eps = play_games(None, self.tok, [GameSpec("crane"), GameSpec("brine")], RolloutConfig(), ALLOWED,
                         generate_fn=backend)
        self.assertEqual([len(b) for b in backend.prompts], [2, 1])
        self.assertEqual(len(eps[0].turns), 1)
        self.assertEqual(eps[1].state.guesses, ["slate", "brine"])

    def test_invalid_replies_counted_and_end_game(self):
        texts = ["no tags at all", reply("zzzzz"), "<think>x</think><guess>toolong</guess>"]
        backend = Scripted(self.tok, [[t] for t in texts])
        cfg = RolloutConfig(max_invalid_replies=3)
        ep = play_games(None, self.tok, [GameSpec("crane")], cfg, ALLOWED, generate_fn=backend)[0]
        self.assertEqual([t.error for t in ep.turns], [MISSING_GUESS, NOT_A_WORD, NOT_FIVE_LETTERS])
        self.assertEqual(ep.invalid_replies, 3)
        self.assertEqual(ep.state.guesses, [])
        self.assertFalse(ep.won)
        second_prompt = self.tok.decode(backend.prompts[1][0])
        self.assertIn("no <guess> </guess> tag", second_prompt)
        self.assertIn("ZZZZZ is not in the word list", self.tok.decode(backend.prompts[2][0]))

    def test_retry_context_turn_reports_every_invalid_reply_of_the_turn(self):
        """With the default 'last' a repeated non-word gives the same prompt again (so greedy play repeats it);
        with 'turn' each retry prompt lists the turn's earlier invalid replies, and a played guess clears them."""
        texts = [reply("boind"), reply("boind"), reply("slate"), "junk", reply("crane")]
        prompts = {}
        for context in ("last", "turn"):
            cfg = RolloutConfig(max_invalid_replies=5)
            cfg = cfg.model_copy(update={"prompt": cfg.prompt.model_copy(update={"retry_context": context})})
            backend = Scripted(self.tok, [[t] for t in texts])
            ep = play_games(None, self.tok, [GameSpec("crane")], cfg, ALLOWED, generate_fn=backend)[0]
            self.assertTrue(ep.won)
            prompts[context] = [self.tok.decode(b[0]) for b in backend.prompts]
        last, turn = prompts["last"], prompts["turn"]
        self.assertEqual(last[1], last[2])                  # the loop greedy play cannot leave
        self.assertEqual(turn[1], last[1])                  # one invalid reply: the same prompt either way
        self.assertIn("BOIND is not in the word list.\nBOIND is not in the word list. Try again.\n", turn[2])
        self.assertNotEqual(turn[2], last[2])
        self.assertNotIn("BOIND", turn[3] + turn[4])       # the played SLATE cleared the list
        self.assertEqual(turn[3], last[3])
        self.assertEqual(turn[4], last[4])                  # a single error after a played guess reads as before

    def test_repeated_guess_is_played_and_flagged(self):
        backend = Scripted(self.tok, [[reply("slate")], [reply("slate")], [reply("crane")]])
        ep = play_games(None, self.tok, [GameSpec("crane")], RolloutConfig(), ALLOWED, generate_fn=backend)[0]
        self.assertEqual([t.repeated for t in ep.turns], [False, True, False])
        self.assertEqual(ep.state.guesses, ["slate", "slate", "crane"])

    def test_seeded_history_is_on_the_board(self):
        backend = Scripted(self.tok, [[reply("crane")]])
        ep = play_games(None, self.tok, [GameSpec("crane", ["slate", "brine"], group=3)],
                        RolloutConfig(prompt=PromptConfig(style="full")), ALLOWED, generate_fn=backend)[0]
        self.assertEqual(ep.seeded, ["slate", "brine"])
        self.assertEqual(ep.state.guesses, ["slate", "brine", "crane"])
        self.assertEqual(ep.model_guesses, ["crane"])
        self.assertEqual(ep.group, 3)
        prompt = self.tok.decode(backend.prompts[0][0])
        self.assertIn("1. SLATE", prompt)
        self.assertIn("2. BRINE", prompt)
        self.assertIn("4 guesses left", prompt)
        with self.assertRaises(ValueError):
            play_games(None, self.tok, [GameSpec("crane", ["crane"])], RolloutConfig(), ALLOWED, generate_fn=backend)

    def test_a_backend_that_takes_boards_gets_each_prompts_board_words(self):
        """A backend with `takes_boards` (the llama.cpp check's) is told each prompt's words on the board, seeded
        guesses included, so it can rule them out as words decoding does; others are called without them."""
        class BoardAware(Scripted):
            takes_boards = True

            def __call__(self, prompts, cfg, excluded=None):
                self.boards = getattr(self, "boards", []) + [[list(b) for b in excluded]]
                return super().__call__(prompts, cfg)

        backend = BoardAware(self.tok, [[reply("slate"), reply("brine")], [reply("crane")]])
        play_games(None, self.tok, [GameSpec("crane", ["pious"]), GameSpec("brine")], RolloutConfig(), ALLOWED,
                   generate_fn=backend)
        self.assertEqual(backend.boards, [[["pious"], []], [["pious", "slate"]]])

    def test_max_turns_caps_games(self):
        backend = Scripted(self.tok, [[reply("slate")], [reply("brine")]])
        ep = play_games(None, self.tok, [GameSpec("crane")], RolloutConfig(max_turns=2), ALLOWED,
                        generate_fn=backend)[0]
        self.assertEqual(len(ep.turns), 2)
        self.assertFalse(ep.state.over)


class TestStopping(unittest.TestCase):
    def test_stop_text_split_over_tokens_and_rambling_hits_length(self):
        tok = tiny()[1]
        vocab = tok.get_vocab()
        ids = [vocab[p] for p in ("\n", "<think>", "x", "</think>", "<guess>", "c", "r", "a", "n", "e", "<0x3C>",
                                  "<0x2F>", "<0x67>", "<0x75>", "<0x65>", "<0x73>", "s", ">", "z")]
        table = dict(zip(ids[:-1], ids[1:]))
        table[vocab["q"]] = vocab["z"]
        model = ScriptedModel(table, len(vocab), default=vocab["z"])
        gen = BatchedGenerator(model, tok)
        cfg = SamplingConfig(max_tokens_per_turn=30)
        good = [vocab["<bos>"], vocab["h"], vocab["\n"]]
        ramble = [vocab["<bos>"], vocab["h"], vocab["q"]]
        out = gen([good, ramble, good], cfg)
        self.assertEqual(out[0].text, "<think>x</think><guess>crane</guess>")
        self.assertEqual(out[0].finish_reason, "stop")
        self.assertEqual(out[0].tokens, ids[1:-1])          # stopped right after the split `</guess>`
        self.assertEqual(out[2].tokens, out[0].tokens)
        self.assertEqual(out[1].finish_reason, "length")
        self.assertEqual(len(out[1].tokens), 30)
        self.assertEqual(out[1].text, "z" * 30)
        for c in out:
            self.assertEqual(len(c.logprobs), len(c.tokens))
            self.assertTrue(all(-1e-3 < lp <= 0 for lp in c.logprobs))   # the scripted model is certain

    def test_rambling_model_is_a_format_failure(self):
        model, tok = tiny()
        cfg = RolloutConfig(max_tokens_per_turn=10, max_invalid_replies=2, decode="free")
        ep = play_games(model, tok, [GameSpec("crane")], cfg, ALLOWED)[0]
        self.assertEqual(len(ep.turns), 2)
        for turn in ep.turns:
            self.assertEqual(turn.finish_reason, "length")
            self.assertEqual(len(turn.completion_tokens), 10)
            self.assertEqual(turn.error, MISSING_GUESS)


class TestInverseCdfSampler(unittest.TestCase):
    def test_samples_follow_softmax_at_the_temperature_and_repeat_with_the_seed(self):
        from wordle_mlx.llm.play.generation import inverse_cdf_sampler
        logits = mx.array([[2.0, 1.0, 0.0, -1.0, -30.0, 0.5]])
        for temperature in (1.0, 0.7):
            sample = inverse_cdf_sampler(temperature)
            rows = mx.repeat(logits - mx.logsumexp(logits, axis=-1, keepdims=True), 4000, axis=0)
            mx.random.seed(3)
            draws = np.concatenate([np.array(sample(rows)) for _ in range(5)])
            freq = np.bincount(draws, minlength=6) / len(draws)
            expected = np.array(mx.softmax(logits[0] / temperature))
            np.testing.assert_allclose(freq, expected, atol=0.015)
            self.assertEqual(freq[4], 0.0)
            mx.random.seed(3)
            self.assertTrue(np.array_equal(np.array(sample(rows)), draws[:4000]))


class TestTinyModelRollouts(unittest.TestCase):
    GAMES = [GameSpec("crane"), GameSpec("pious", ["slate"]), GameSpec("dumpy", ["brine", "stomp"]), GameSpec("crane")]

    def test_batched_equals_unbatched_at_temperature_0(self):
        model, tok = tiny()
        cfg = RolloutConfig(max_tokens_per_turn=12, max_invalid_replies=3, decode="free")
        batched = play_games(model, tok, self.GAMES, cfg, ALLOWED)
        single = [play_games(model, tok, [g], cfg.model_copy(update={"reuse_prefix": False}), ALLOWED)[0]
                  for g in self.GAMES]
        self.assertEqual(sum(len(ep.turns) for ep in batched), 12)
        for b, s in zip(batched, single):
            self.assertEqual([t.prompt_tokens for t in b.turns], [t.prompt_tokens for t in s.turns])
            self.assertEqual([t.completion_tokens for t in b.turns], [t.completion_tokens for t in s.turns])
            for tb, ts in zip(b.turns, s.turns):
                for x, y in zip(tb.logprobs, ts.logprobs):
                    self.assertAlmostEqual(x, y, delta=1e-3)
        again = play_games(model, tok, self.GAMES, cfg, ALLOWED)
        self.assertEqual([[t.completion_tokens for t in ep.turns] for ep in again],
                         [[t.completion_tokens for t in ep.turns] for ep in batched])

    def test_token_sequences_and_logprobs_match_a_recomputation(self):
        model, tok = tiny()
        for temperature in (0.0, 0.7):
            cfg = RolloutConfig(max_tokens_per_turn=9, max_invalid_replies=2, temperature=temperature, seed=5, decode="free")
            eps = play_games(model, tok, self.GAMES[:3], cfg, ALLOWED)
            temp = policy_logprob_temperature(cfg)
            self.assertEqual(temp, temperature or 1.0)
            for ep in eps:
                seqs = ep.token_sequences()
                self.assertEqual(len(seqs), len(ep.turns))
                for seq, turn in zip(seqs, ep.turns):
                    n = len(turn.prompt_tokens)
                    self.assertEqual(len(seq.tokens), len(seq.mask))
                    self.assertEqual(len(seq.tokens), len(seq.logprobs))
                    self.assertEqual(seq.mask, [0] * n + [1] * len(turn.completion_tokens))
                    self.assertEqual(seq.tokens[n:], turn.completion_tokens)
                    self.assertEqual(seq.tokens[:n], turn.prompt_tokens)
                    logits = model(mx.array(seq.tokens)[None])[0]
                    target = mx.array(seq.tokens[n:])
                    again = policy_logprobs(logits[n - 1:-1], target, temp).tolist()
                    for x, y in zip(seq.logprobs[n:], again):
                        self.assertTrue(math.isfinite(x) and x <= 0)
                        self.assertAlmostEqual(x, y, delta=2e-3)

    def test_sample_replies_groups(self):
        model, tok = tiny()
        cfg = RolloutConfig(max_tokens_per_turn=6, temperature=1.0, seed=1, decode="free")
        from wordle_mlx.game.state import GameState
        prompts = [prompt_token_ids(tok, cfg, GameState("crane")), prompt_token_ids(tok, cfg, GameState("crane", ["slate"]))]
        groups = sample_replies(model, tok, prompts, 4, cfg)
        self.assertEqual([len(g) for g in groups], [4, 4])
        self.assertGreater(len({tuple(c.tokens) for c in groups[0]}), 1)     # sampled, not copies
        self.assertEqual(sample_replies(model, tok, prompts, 4, cfg)[1][2].tokens, groups[1][2].tokens)  # seeded
        greedy = sample_replies(model, tok, prompts, 3, cfg.model_copy(update={"temperature": 0.0}))
        for g, p in zip(greedy, prompts):
            alone = BatchedGenerator(model, tok)([p], cfg.model_copy(update={"temperature": 0.0}))[0]
            self.assertTrue(all(c.tokens == alone.tokens for c in g))

    def test_greedy_rows_in_the_sampling_batch(self):
        """sample_replies_and_greedy: the G samples plus a greedy row per prompt in one batch. The greedy rows
        equal a separate greedy call (tokens, and T = 1 log-probs), the samples are still sampled, and each
        prompt is prefilled once for its G + 1 rows."""
        from wordle_mlx.game.state import GameState
        from wordle_mlx.llm.play.rollout import sample_replies_and_greedy
        model, tok = tiny()
        cfg = RolloutConfig(max_tokens_per_turn=6, temperature=0.7, seed=1, decode="free")
        greedy_cfg = cfg.model_copy(update={"temperature": 0.0})
        prompts = [prompt_token_ids(tok, cfg, GameState("crane")), prompt_token_ids(tok, cfg, GameState("crane", ["slate"]))]
        one_batch = BatchedGenerator(model, tok)
        samples, greedy = sample_replies_and_greedy(model, tok, prompts, 4, cfg, one_batch)
        self.assertEqual([len(g) for g in samples], [4, 4])
        self.assertEqual(len(greedy), 2)
        self.assertGreater(len({tuple(c.tokens) for c in samples[0]}), 1)
        two_calls = BatchedGenerator(model, tok)
        sample_replies(model, tok, prompts, 4, cfg, two_calls)
        for p, got in zip(prompts, greedy):
            alone = two_calls([p], greedy_cfg)[0]
            self.assertEqual(got.tokens, alone.tokens)
            for x, y in zip(got.logprobs, alone.logprobs):
                self.assertAlmostEqual(x, y, delta=1e-4)
        self.assertLess(one_batch.prefilled_tokens, two_calls.prefilled_tokens)
        scripted = Scripted(tok, [["<guess>crane</guess>"] * 8, ["<guess>slate</guess>"] * 2])
        samples, greedy = sample_replies_and_greedy(model, tok, prompts, 4, cfg, scripted)   # another backend:
        self.assertEqual([c.text for c in greedy], ["<guess>slate</guess>"] * 2)             # two calls
        with self.assertRaises(ValueError):
            one_batch(prompts, cfg, greedy=[True])

    def test_greedy_rows_can_carry_sampling_temperature_logprobs(self):
        """With greedy_logprobs_at_temperature the greedy row keeps its argmax tokens but records
        log_softmax(logits / T) at them, as a teacher-forced recomputation at T gives; another backend
        cannot when T != 1."""
        from wordle_mlx.game.state import GameState
        from wordle_mlx.llm.play.rollout import sample_replies_and_greedy
        model, tok = tiny()
        cfg = RolloutConfig(max_tokens_per_turn=6, temperature=0.5, seed=1, decode="free")
        prompts = [prompt_token_ids(tok, cfg, GameState("crane")),
                   prompt_token_ids(tok, cfg, GameState("crane", ["slate"]))]
        _, at_one = sample_replies_and_greedy(model, tok, prompts, 3, cfg, BatchedGenerator(model, tok))
        _, at_t = sample_replies_and_greedy(model, tok, prompts, 3, cfg, BatchedGenerator(model, tok),
                                            greedy_logprobs_at_temperature=True)
        for p, one, got in zip(prompts, at_one, at_t):
            self.assertEqual(got.tokens, one.tokens)
            logits = model(mx.array(list(p) + got.tokens)[None])[0]
            again = policy_logprobs(logits[len(p) - 1:-1], mx.array(got.tokens), 0.5).tolist()
            for x, y, z in zip(got.logprobs, again, one.logprobs):
                self.assertAlmostEqual(x, y, delta=2e-3)
            self.assertGreater(max(abs(x - z) for x, z in zip(got.logprobs, one.logprobs)), 1e-3)
        scripted = Scripted(tok, [["<guess>crane</guess>"] * 8, ["<guess>slate</guess>"] * 2])
        with self.assertRaises(ValueError):
            sample_replies_and_greedy(model, tok, prompts, 4, cfg, scripted, greedy_logprobs_at_temperature=True)


class TestGemma270M(unittest.TestCase):
    def test_two_games_structure(self):
        model, tok = load_model("builtin:gemma-3-270m")
        cfg = RolloutConfig(max_tokens_per_turn=48, max_invalid_replies=2, max_turns=3, decode="free")
        eps = play_games(model, tok, [GameSpec("crane"), GameSpec("pious", ["slate"])], cfg, ALLOWED)
        self.assertEqual([ep.secret for ep in eps], ["crane", "pious"])
        bos = tok.bos_token_id
        for ep in eps:
            self.assertGreaterEqual(len(ep.turns), 1)
            self.assertLessEqual(len(ep.turns), 3)
            self.assertTrue(ep.won or ep.invalid_replies == 2 or len(ep.turns) == 3 or ep.state.over)
            for turn in ep.turns:
                self.assertEqual(turn.prompt_tokens[0], bos)
                self.assertTrue(1 <= len(turn.completion_tokens) <= 48)
                self.assertEqual(len(turn.logprobs), len(turn.completion_tokens))
                self.assertTrue(all(math.isfinite(x) and x <= 0 for x in turn.logprobs))
                self.assertIn(turn.finish_reason, ("stop", "length"))
                self.assertEqual(turn.pattern is None, turn.error is not None)
            self.assertEqual(len(ep.token_sequences()), len(ep.turns))


if __name__ == "__main__":
    unittest.main()
