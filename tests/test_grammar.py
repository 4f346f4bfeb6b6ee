"""Grammar-constrained replies (llm/play/reply_grammar.py, llm/play/letter_decoder.py): the reply's shape per tokenizer, and
the policy grammar and words decoding play is exactly the full model's distribution at each letter, masked to the
allowed letters and renormalised, in the rollout, the GRPO update and the SFT loss (float32, within 1e-5, on the
tiny model and on the 270M; in words decoding with each board's words, and the greedy word itself, ruled out); the
GRPO ratio is exactly 1 before the update in every mode, and the sampler and the trainer agree in bfloat16 and 4-bit
too; words decoding never writes a word outside the allowed list and never offers a word already on the board."""

from __future__ import annotations

import random
import unittest
from pathlib import Path

import mlx.core as mx
import mlx.optimizers as optim
import numpy as np
from mlx.utils import tree_map

from wordle_mlx.errors import UserError
from wordle_mlx.game.state import GameState
from wordle_mlx.game.words import answers, guess_list
from wordle_mlx.llm.model import lora
from wordle_mlx.llm.play.generation import BatchedGenerator, SamplingConfig
from wordle_mlx.llm.training.rl import LossSettings, grpo_loss
from wordle_mlx.llm.training.packing import averaging_weights, batch_arrays, pack_batch, pack_shared_batch
from wordle_mlx.llm.model.logits import selected_logprobs
from wordle_mlx.game.rewards import RewardWeights, Rewards
from wordle_mlx.llm.training.rl import Player, ScoredItem, UpdateSettings, policy_update, rollout
from wordle_mlx.llm.model.models import load_model
from wordle_mlx.llm.play.prompts import PromptConfig, parse_reply
from wordle_mlx.llm.play.reply_grammar import LETTERS, LetterChoices, LetterGrammar, WordTrie, effective_mode
from wordle_mlx.llm.play.rollout import GameSpec, RolloutConfig, play_games, prompt_token_ids
from wordle_mlx.llm.play.episode import reply_sequence
from wordle_mlx.llm.training.sft_loss import loss_sum, make_batch

from tests import assert_f32_close
from tests.dtype_models import tiny_model_in

WORDS = guess_list()
ALLOWED = frozenset(WORDS)
TRIE = WordTrie(WORDS)
BOARDS = [[], ["slate"], ["brine", "stomp"], ["crane", "pious", "dumpy"]]


def grammar_of(tokenizer) -> LetterGrammar:
    return LetterGrammar.for_tokenizer(tokenizer)


SHIPPED = str(Path(__file__).resolve().parents[1] / "adapters" / "gemma-3-270m-wordle")


def lora_policy(spec: str, dtype: str = "float32", seed: int = 5):
    """The model with random LoRA weights (so LoRA is part of every forward); the 270M with the shipped adapter,
    whose trained weights keep the network as well conditioned as a real policy (large random LoRA weights make
    a deep model amplify float32 rounding, and OpenBLAS rounds a one-row product differently from a long one).
    float32 unless asked, whatever the device's default: the callers compare at float32 tolerances."""
    if spec == "builtin:gemma-3-270m":
        model, tokenizer = load_model(spec, adapter_path=SHIPPED, dtype=dtype)
        model.eval()
        return model, tokenizer
    model, tokenizer = load_model(spec, dtype=dtype)
    mx.random.seed(seed)
    lora.apply_lora(model, -1, lora.lora_parameters(4, 10.0, 0.0, None))
    model.update(tree_map(lambda p: mx.random.normal(p.shape) * 0.05, model.trainable_parameters()))
    mx.eval(model.parameters())
    model.eval()
    return model, tokenizer


def prompts_for(tokenizer, n: int = 4) -> list[list[int]]:
    cfg = RolloutConfig()
    return [prompt_token_ids(tokenizer, cfg, GameState("crane", BOARDS[i % len(BOARDS)])) for i in range(n)]


def words_mask(prefix: str, board) -> np.ndarray:
    """The letters that continue `prefix` into an allowed word that is not on `board` (by brute force over the
    word list, independently of WordTrie)."""
    nexts = {w[len(prefix)] for w in WORDS if w.startswith(prefix) and w not in board}
    return np.array([c in nexts for c in LETTERS])


def reference_logprobs(model, grammar: LetterGrammar, prompt: list[int], tokens: list[int], choice: list[int],
                       temperature: float, words: bool, board=()) -> tuple[list[float], float]:
    """The full model's log_softmax(logits / T) over the whole vocabulary at each letter choice, masked to the
    allowed letters (in words mode: those that continue a word off `board`) and renormalised: the policy grammar
    (and words) decoding should play; and the largest |logit / T| at those choices, the scale of their float32
    rounding."""
    seq = list(prompt) + list(tokens)
    logits = model(mx.array(seq)[None])[0].astype(mx.float32) / temperature
    logp = logits - mx.logsumexp(logits, axis=-1, keepdims=True)        # full-vocabulary log-softmax
    out, written, scale = [], "", 0.0
    for j, (t, c) in enumerate(zip(tokens, choice)):
        if not c:
            continue
        scale = max(scale, float(mx.abs(logits[len(prompt) + j - 1]).max()))
        row = np.array(logp[len(prompt) + j - 1])[grammar.letter_ids]
        if words:
            row = np.where(words_mask(written, board), row, -np.inf)
        row = row - np.log(np.exp(row - row.max()).sum()) - row.max()
        out.append(float(row[grammar.index_of[t]]))
        written += LETTERS[grammar.index_of[t]]
    return out, scale


def full_logprobs(model, prompt: list[int], tokens: list[int], scored: list[int]) -> list[float]:
    """The full model's log-softmax over the whole vocabulary at each of `tokens` where `scored` is 1."""
    seq = list(prompt) + list(tokens)
    logits = model(mx.array(seq)[None])[0].astype(mx.float32)
    logp = np.array(logits - mx.logsumexp(logits, axis=-1, keepdims=True))
    return [float(logp[len(prompt) + j - 1, t]) for j, (t, on) in enumerate(zip(tokens, scored)) if on]


# The fast paths split the prompt: the letter decoder runs every board's remainder as one packed stream
# (llm/model/packed.py), each block's products over all boards' tokens at once, and the update runs a shared prompt
# once with the replies after it (llm/training/packing.py). OpenBLAS then blocks and sums in another order than the
# full forward of one sequence. Measured on the 270M, in float32 ulps of the largest scaled logit: the decoder's
# log-probs against the full model's up to 14, its letter logits against a prefill one prompt at a time up to 10,
# the update's log-probs against the full model's up to 5 (4 was the bound before the packed prefill). The shipped
# adapter's 200 greedy games are identical either way, in words and grammar decoding; a defect (a wrong mask,
# position or key) moves the numbers by orders of magnitude more.
SPLIT_PROMPT_ULPS = 32


def rounding_tolerance(tol: float, scale: float, ulps: int = 4) -> float:
    """`tol`, or `ulps` float32 ulps of the largest scaled logit when that is more: the decoder and the full
    forward round the same sums in different orders (one row against the whole sequence), so their gap grows
    with |logit / T| (the 270M's logits reach about 60, 86 at T = 0.7), whatever the load on the cores."""
    return max(tol, ulps * np.finfo(np.float32).eps * scale)


class ShapeAndModesTest(unittest.TestCase):
    def test_gemma_reply_is_three_tags_five_letters_three_tags_and_the_end(self):
        _, tok = load_model("builtin:gemma-3-270m")
        g = grammar_of(tok)
        self.assertEqual((len(g.open), g.sep, len(g.close)), (3, [], 3))
        tokens, choice = g.reply([LETTERS.index(c) for c in "crane"])
        self.assertEqual(tokens, tok.encode("<guess> c r a n e</guess>", add_special_tokens=False) + [g.end])
        self.assertEqual(choice, [0, 0, 0, 1, 1, 1, 1, 1, 0, 0, 0, 0])
        self.assertEqual(tok.convert_ids_to_tokens(g.end), "<end_of_turn>")

    def test_character_tokenizer_has_a_forced_space_before_each_letter(self):
        _, tok = load_model("builtin:tiny-random")
        g = grammar_of(tok)
        self.assertEqual(len(g.sep), 1)
        tokens, choice = g.reply([LETTERS.index(c) for c in "crane"])
        self.assertEqual(tok.decode(tokens[:-1]), "<guess> c r a n e</guess>")
        self.assertEqual(sum(choice), 5)
        seq = reply_sequence([7, 8], tokens, [0.0] * len(tokens), choice)   # forced tail left out, forced mid masked
        self.assertEqual(seq.mask, [0, 0] + choice[:choice.index(1) + 9])
        self.assertEqual(seq.tokens[-1], tokens[max(i for i, c in enumerate(choice) if c)])

    def test_free_text_formats_are_decoded_free_unless_grammar_was_asked_for(self):
        think = PromptConfig(require_think=True)
        word = PromptConfig(guess_format="word")
        self.assertEqual(effective_mode("grammar", PromptConfig(), False), "grammar")
        self.assertEqual(effective_mode("grammar", think, False), "free")
        self.assertEqual(effective_mode("words", word, False), "free")
        with self.assertRaisesRegex(UserError, "decode: 'words' decoding needs guess_format 'letters'"):
            effective_mode("words", word, True)
        with self.assertRaisesRegex(UserError, "unknown mode 'fast'"):
            effective_mode("fast", PromptConfig(), True)
        self.assertEqual(RolloutConfig(prompt=think).decode, "grammar")


class LogprobsEqualTheRenormalisedModelTest(unittest.TestCase):
    """Rollout, update and SFT loss against the full model's masked, renormalised log-softmax (float32)."""

    def check_model(self, spec: str, n_prompts: int, temperatures=(0.0, 0.7, 1.0), tol: float = 1e-5):
        model, tok = lora_policy(spec)
        g = grammar_of(tok)
        prompts = prompts_for(tok, n_prompts)
        greedy_words = [parse_reply(c.text, False, ALLOWED).guess for c in BatchedGenerator(
            model, tok, mode="words", words=WORDS)(prompts, SamplingConfig(completion_batch_size=5))]
        for mode in ("grammar", "words"):
            # words mode: each prompt's board, and the word greedy words decoding gives it, are ruled out
            boards = [BOARDS[i % len(BOARDS)] + ([greedy_words[i]] if mode == "words" else [])
                      for i in range(n_prompts)]
            for temperature in temperatures:
                generate = BatchedGenerator(model, tok, mode=mode, words=WORDS)
                cfg = SamplingConfig(temperature=temperature, seed=3, completion_batch_size=5)
                mx.random.seed(3)
                rows = [i for i in range(n_prompts) for _ in range(2)]
                replies = generate([prompts[i] for i in rows], cfg, excluded=[boards[i] for i in rows])
                t = temperature or 1.0
                seqs, at_t = [], tol
                for i, c in zip(rows, replies):
                    p, board = prompts[i], boards[i]
                    self.assertEqual(c.text.replace(" ", "")[:7], "<guess>")
                    ref, scale = reference_logprobs(model, g, p, c.tokens, c.choice, t, mode == "words", board)
                    at_t = max(at_t, rounding_tolerance(tol, scale, SPLIT_PROMPT_ULPS))
                    got = [lp for lp, ch in zip(c.logprobs, c.choice) if ch]
                    self.assertEqual(len(got), 5)
                    np.testing.assert_allclose(got, ref, atol=at_t, rtol=0, err_msg=f"{spec} {mode} T={t} rollout")
                    self.assertTrue(all(lp == 0.0 for lp, ch in zip(c.logprobs, c.choice) if not ch))
                    if mode == "words":
                        guess = parse_reply(c.text, False, ALLOWED).guess
                        self.assertIn(guess, ALLOWED)
                        self.assertNotIn(guess, board, f"{spec} T={t}: a word on the board was offered again")
                    seqs.append((reply_sequence(p, c.tokens, c.logprobs, c.choice, excluded=board), ref))
                self.check_update(model, g, seqs, mode, t, at_t)
            self.check_sft(model, tok, g, prompts, tol)

    def check_update(self, model, g, seqs, mode, temperature, tol):
        letters = LetterChoices(g, TRIE if mode == "words" else None)
        settings = LossSettings(temperature=temperature, letters=letters)
        q = [s for s, _ in seqs]
        weights = averaging_weights([sum(s.mask) for s in q])
        packs = [pack_batch(q, [1.0] * len(q), weights)]
        if all(m == 1 for m in q[0].mask[q[0].mask.index(1):]):       # replies that follow the prompt directly
            packs.append(pack_shared_batch(q[:2], [1.0, -1.0], weights[:2]))
        for batch in packs:
            arrays = batch_arrays(batch, letters=letters)
            new = selected_logprobs(model, arrays["inputs"], arrays["positions"], arrays["targets"], temperature,
                                    arrays.get("prefix"), arrays["choices"])
            ref = np.concatenate([r for _, r in seqs][:len(batch.targets) // 5])
            np.testing.assert_allclose(np.array(new), ref, atol=tol, rtol=0, err_msg=f"{mode} update")
            np.testing.assert_allclose(np.array(new), batch.old_logprobs, atol=3 * tol, rtol=0,
                                       err_msg=f"{mode} sampler")            # the sampler's log-probs
            loss, _ = grpo_loss(model, arrays, settings)                   # -sum(w A): the ratio is 1
            assert_f32_close(self, loss.item(), -float((batch.weights * batch.advantages).sum()), scale=1.0)

    def check_sft(self, model, tok, g, prompts, tol):
        """The grammar loss, the words loss (each board's words and near misses of the label ruled out) and both
        with the forced tokens trained over the whole vocabulary (train_free)."""
        words = ["crane", "moist", "pious", "light"]
        near = [["crank", "craze"], ["moose"], [], ["might", "lithe"]]
        for words_mode, train_free in ((False, False), (True, False), (True, True)):
            examples, refs, tag_refs = [], [], []
            for i, (p, word) in enumerate(zip(prompts, words)):
                board = BOARDS[i % len(BOARDS)] + near[i] if words_mode else []
                tokens, choice = g.reply([LETTERS.index(c) for c in word])
                examples.append((list(p) + tokens, len(p), board))
                ref, scale = reference_logprobs(model, g, p, tokens, choice, 1.0, words_mode, board)
                refs += ref
                tol = rounding_tolerance(tol, scale)
                if train_free:
                    tag_refs += full_logprobs(model, p, tokens, [1] * len(choice))   # every reply token
            for share in (False, True):
                b = make_batch(examples, pad_to=8, share_prefix=share, letter_ids=g.letter_ids,
                               trie=TRIE if words_mode else None, train_free=train_free)
                total, count = loss_sum(model, *b.loss_args())
                self.assertEqual(count.item(), len(refs) + len(tag_refs))
                self.assertEqual(b.tokens, len(refs) + len(tag_refs))
                self.assertLessEqual(abs(total.item() + sum(refs) + sum(tag_refs)), tol * (len(refs) + len(tag_refs)),
                                     f"words {words_mode} tags {train_free} shared {share}")
                if words_mode and not share:
                    full, _ = loss_sum(model, *b.loss_args()[:4], True, *b.loss_args()[5:])   # full-logits path
                    self.assertLessEqual(abs(full.item() - total.item()), tol * len(refs))

    def test_tiny_model(self):
        self.check_model("builtin:tiny-random", 4)

    def test_gemma_270m(self):
        # the shipped adapter's policy; its logits reach about 60, whose float32 rounding through 18 blocks is
        # about 1e-5 (measured here: at most 8e-6 at T = 1 on a quiet machine and 2e-5 at T = 0.7 beside other
        # jobs, with OpenBLAS, which rounds a one-row product differently from the full sequence's)
        self.check_model("builtin:gemma-3-270m", 2, temperatures=(0.0, 0.7))


class MacDtypesTest(unittest.TestCase):
    """bfloat16 and 4-bit: the sampler's letter log-probs and the trainer's are the same policy (to bf16
    rounding), and the update's ratio is exactly 1."""

    def test_sampler_and_trainer_agree(self):
        for kind in ("bfloat16-multimodal", "4bit-multimodal"):
            model, tok = lora_policy(tiny_model_in(kind), "bfloat16")
            g = grammar_of(tok)
            prompts = prompts_for(tok, 2)
            replies = BatchedGenerator(model, tok, mode="grammar")([p for p in prompts for _ in range(4)],
                                                                   SamplingConfig(temperature=1.0, seed=2))
            items = [ScoredItem([reply_sequence(p, c.tokens, c.logprobs, c.choice)], i // 4, float(i % 4), {})
                     for i, (p, c) in enumerate(zip([p for p in prompts for _ in range(4)], replies))]
            letters = LetterChoices(g)
            q = [it.sequences[0] for it in items[:4]]
            batch = pack_batch(q, [1.0] * 4, averaging_weights([5] * 4))    # forced spaces: not shared
            arrays = batch_arrays(batch, letters)
            new = selected_logprobs(model, arrays["inputs"], arrays["positions"], arrays["targets"], 1.0, None,
                                    arrays["choices"])
            self.assertLess(float(np.abs(np.array(new) - batch.old_logprobs).max()), 0.05, kind)   # bf16 logits
            optimizer = __import__("mlx.optimizers", fromlist=["AdamW"]).AdamW(learning_rate=1e-5)
            optimizer.init(model.trainable_parameters())
            result = policy_update(model, optimizer, items, UpdateSettings(LossSettings(letters=letters)))
            self.assertTrue(result.applied, kind)
            self.assertEqual(result.trained_tokens, 40, kind)


class WordsModeGRPOTest(unittest.TestCase):
    def test_rollout_and_update_score_the_same_masked_policy(self):
        """A GRPO rollout in words decoding on seeded boards (G samples and the greedy reply, hot sampling): every
        reply is off its board, each sequence carries that board, the trainer's log-probs of the sampled letters
        equal the sampler's (float32 rounding of the logits' size), and the update applies."""
        model, tok = lora_policy("builtin:tiny-random", seed=4)
        g = grammar_of(tok)
        cfg = RolloutConfig(decode="words", temperature=1.5, seed=2)
        specs = [GameSpec("crane", ["slate"]), GameSpec("pious", ["brine", "stomp"]), GameSpec("light")]
        out = rollout(Player(model, tok, BatchedGenerator(model, tok, mode="words", words=WORDS)), specs, cfg,
                      ALLOWED, Rewards(RewardWeights(early=1.2), answers()), 4)
        letters = LetterChoices(g, TRIE)
        seqs = [it.sequences[0] for it in out.items]
        self.assertTrue(seqs)
        scale = 0.0
        for q in seqs:
            board = set(q.excluded)
            word = "".join(LETTERS[g.index_of[t]] for t, m in zip(q.tokens, q.mask) if m)
            self.assertIn(word, ALLOWED)
            self.assertNotIn(word, board)
            logits = model(mx.array(q.tokens)[None])[0].astype(mx.float32) / 1.5
            scale = max(scale, float(mx.abs(logits).max()))
        tol = rounding_tolerance(1e-5, scale)
        for ep in out.episodes:
            self.assertFalse(any(t.repeated for t in ep.turns))
        batch = pack_batch(seqs, [1.0] * len(seqs), averaging_weights([sum(q.mask) for q in seqs]))
        arrays = batch_arrays(batch, letters=letters)
        new = selected_logprobs(model, arrays["inputs"], arrays["positions"], arrays["targets"], 1.5, None,
                                arrays["choices"])
        np.testing.assert_allclose(np.array(new), batch.old_logprobs, atol=tol, rtol=0)
        optimizer = optim.SGD(learning_rate=0.01)
        result = policy_update(model, optimizer, out.items, UpdateSettings(LossSettings(temperature=1.5,
                                                                                         letters=letters)))
        self.assertTrue(result.applied)


class WordsModeFuzzTest(unittest.TestCase):
    def test_words_mode_never_writes_a_non_word(self):
        """Random boards, random LoRA weights, hot sampling: every reply is an allowed word off the board."""
        rng = random.Random(0)
        for spec, seed in (("builtin:tiny-random", 1), ("builtin:tiny-random", 2), ("builtin:gemma-3-270m", 3)):
            model, tok = lora_policy(spec, seed=seed)
            n = 6 if spec == "builtin:gemma-3-270m" else 12
            specs = [GameSpec(rng.choice(answers()), rng.sample(WORDS, rng.randint(0, 4))) for _ in range(n)]
            specs = [s for s in specs if s.secret not in s.seeded_guesses]
            for temperature in (0.0, 2.0):
                cfg = RolloutConfig(decode="words", temperature=temperature, seed=seed, max_turns=2)
                for ep in play_games(model, tok, specs, cfg, ALLOWED):
                    for turn in ep.turns:
                        self.assertIsNone(turn.error, turn.text)
                        self.assertIn(turn.guess, ALLOWED)
                        self.assertFalse(turn.repeated, f"{turn.guess} was already on the board")


if __name__ == "__main__":
    unittest.main()
