"""The optional allowed-words constraint for letters-format replies (llm/word_constraint.py): the trie, the
forced reply shape, and greedy decoding under it always spelling an allowed word, with Gemma's tokenizer."""

from __future__ import annotations

import random
import unittest

import mlx.core as mx
import numpy as np
from mlx_lm.utils import load_tokenizer

from wordle_mlx.errors import UserError
from wordle_mlx.game.words import guess_list
from wordle_mlx.llm.models import load_model, resolve_model
from wordle_mlx.llm.prompts import PromptConfig, parse_reply
from wordle_mlx.llm.rollout import GameSpec, RolloutConfig, play_games
from wordle_mlx.llm.word_constraint import AllowedWordsConstraint, LettersTemplate, prefix_trie

WORDS = guess_list()


class TrieTest(unittest.TestCase):
    def test_prefixes_and_next_letters(self):
        trie = prefix_trie(["crane", "crate", "slate"])
        self.assertEqual(trie[""], {"c", "s"})
        self.assertEqual(trie["cra"], {"n", "t"})
        self.assertEqual(trie["slat"], {"e"})
        self.assertNotIn("crane", trie)
        full = prefix_trie(WORDS)
        for w in random.Random(0).sample(WORDS, 300):      # every allowed word can be spelled through it
            self.assertTrue(all(w[i] in full[w[:i]] for i in range(5)), w)
        self.assertNotIn("qz", full)


class GemmaConstraintTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tok = load_tokenizer(resolve_model("builtin:gemma-3-270m"))
        cls.end = cls.tok.get_vocab()["<end_of_turn>"]
        cls.template = LettersTemplate(cls.tok, cls.end)
        cls.trie = prefix_trie(WORDS)

    def decode(self, logits_fn, context_length: int = 7) -> list[int]:
        """Greedy decoding of 12 tokens where the raw logits come from `logits_fn(step)`."""
        proc = AllowedWordsConstraint(self.template, self.trie, context_length)
        context = list(range(100, 100 + context_length))
        out = []
        for step in range(12):
            logits = proc(mx.array(context + out), logits_fn(step)[None])
            out.append(int(mx.argmax(logits[0]).item()))
        return out

    def test_greedy_decoding_always_spells_an_allowed_word(self):
        allowed = set(WORDS)
        rng = np.random.default_rng(0)
        vocab = len(self.tok.get_vocab())
        for trial in range(30):
            noise = rng.standard_normal((12, vocab)).astype(np.float32)
            tokens = self.decode(lambda step: mx.array(noise[step]))
            self.assertEqual(tokens[-1], self.end)
            parsed = parse_reply(self.tok.decode(tokens[:-1]), False, allowed)
            self.assertIsNone(parsed.error, self.tok.decode(tokens))
            self.assertIn(parsed.guess, allowed)

    def test_the_model_still_chooses_among_allowed_letters(self):
        # logits that prefer the letters of "zzzzz" then "crane": the constraint keeps the reachable word closest
        letter = self.template.letter
        vocab = len(self.tok.get_vocab())

        def prefer(word: str):
            def fn(step):
                row = np.zeros(vocab, dtype=np.float32)
                if 3 <= step < 8:
                    row[letter[word[step - 3]]] = 5.0
                return mx.array(row)
            return fn

        self.assertEqual(parse_reply(self.tok.decode(self.decode(prefer("crane"))[:-1]), False, None).guess, "crane")
        qword = parse_reply(self.tok.decode(self.decode(prefer("qzzzz"))[:-1]), False, set(WORDS)).guess
        self.assertIn(qword, set(WORDS))
        self.assertTrue(qword.startswith("q"))

    def test_word_format_is_refused(self):
        model, tok = load_model("builtin:tiny-random")
        cfg = RolloutConfig(constrain=True, max_tokens_per_turn=4, prompt=PromptConfig(guess_format="word"))
        with self.assertRaisesRegex(UserError, "needs guess_format 'letters'"):
            play_games(model, tok, [GameSpec("crane")], cfg, WORDS)

    def test_other_tokenizers_are_refused_with_a_reason(self):
        _, tiny_tok = load_model("builtin:tiny-random")
        with self.assertRaisesRegex(UserError, "--constrain: this tokenizer"):
            LettersTemplate(tiny_tok, 1)


if __name__ == "__main__":
    unittest.main()
