"""Fast play and fast updates: the lockstep letter decoder's packed prefill (the same states, letters and log-probs
as one prompt at a time, for remainders of very different lengths, one of a single token) and batch independence
(a game that ends leaves the others' replies as they were), the update's micro-batches of several prompts (the same
loss and gradients as one micro-batch a prompt, the system prompt they share run once), and an update that trains
only the last blocks (the same gradients for those blocks as a full backward pass). The decoder's log-probs against
the full model are in test_grammar.py."""

from __future__ import annotations

import unittest
from unittest import mock

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_flatten

from wordle_mlx.game.state import GameState
from wordle_mlx.llm.model.lora import freeze_lora_below
from wordle_mlx.llm.play.episode import reply_sequence
from wordle_mlx.llm.play.generation import BatchedGenerator, SamplingConfig
from wordle_mlx.llm.model.logits import body_hidden, head_rows, text_model
from wordle_mlx.llm.model import packed
from wordle_mlx.llm.model.packed import attention_chunks, fold_lora, packed_prefill, projections
from wordle_mlx.llm.play import letter_decoder
from wordle_mlx.llm.play.tokens import common_prefix_length
from wordle_mlx.llm.play.reply_grammar import LetterChoices, LetterGrammar
from wordle_mlx.llm.play.rollout import RolloutConfig, prompt_token_ids
from wordle_mlx.llm.training.rl import LossSettings, grpo_loss, policy_logprobs
from wordle_mlx.llm.training.packing import averaging_weights, batch_arrays, merge_prompt_groups, pack_shared_batch, shared_prompt_groups

from tests import F32_RTOL
from tests.test_grammar import SPLIT_PROMPT_ULPS, WORDS, lora_policy, rounding_tolerance

BOARDS = [[], ["slate"], ["brine", "stomp"], ["crane", "pious", "dumpy"], ["raise"], ["clout", "denim"]]


def board_prompts(tokenizer, secret: str = "light") -> list[list[int]]:
    cfg = RolloutConfig()
    return [prompt_token_ids(tokenizer, cfg, GameState(secret, b)) for b in BOARDS]


def flat(tree) -> dict:
    return dict(tree_flatten(tree))


def padded_prefill(model, segments, prefix_kv, shared, start=None, folded=False):
    """The reference prefill: one remainder at a time through `body_hidden` after the shared start's keys (no
    packing, no padding), in `packed_prefill`'s output shapes; with `start` (the shared tokens themselves) the start
    runs first through `body_hidden`, and the keys and values returned begin with its own, as the packed stream's
    do. The global random state is left as it was (each block call of `body_hidden` would draw a dropout key from
    it, and no dropout runs here), so a sampled decoding draws what the packed one does."""
    def no_draw(low, high, shape):
        return mx.zeros(shape, mx.int32)

    if start is not None:
        with mock.patch.object(mx.random, "randint", no_draw):
            prefix_kv = body_hidden(model, mx.array(list(start))[None], keep_kv=True)[1]
    last, kvs = [], [[kv] for kv in prefix_kv] if start is not None else None
    for seg in segments:
        with mock.patch.object(mx.random, "randint", no_draw):
            hidden, kv = body_hidden(model, mx.array(list(seg))[None], prefix_kv, keep_kv=True)
        last.append(hidden[0, -1])
        kvs = [[k] for k in kv] if kvs is None else [acc + [k] for acc, k in zip(kvs, kv)]
    return mx.stack(last), [tuple(mx.concatenate([k[j] for k in acc], axis=2) for j in (0, 1)) for acc in kvs]


def uneven_prompts(tokenizer, grammar) -> list[list[int]]:
    """Prompts whose remainders after their shared start differ widely in length, one of them a single token."""
    prompts = [p + grammar.open + grammar.sep for p in board_prompts(tokenizer)]
    shared = common_prefix_length(prompts)
    return prompts + [prompts[0][:shared] + [prompts[0][-1]]]


class PackedPrefillTest(unittest.TestCase):
    """The packed prefill (every remainder in one stream) against one remainder at a time: the same letters and
    log-probs, and the same keys, values and letter logits to float32 rounding of their size."""

    def test_attention_chunks_cover_whole_segments(self):
        lengths = [1, 3, 200, 5, 64, 64, 1]
        chunks = attention_chunks(lengths, 128)
        ends = set(np.cumsum(lengths).tolist()) | {0}
        self.assertEqual((chunks[0][0], chunks[-1][1]), (0, sum(lengths)))
        for (lo, hi), (lo2, _) in zip(chunks, chunks[1:] + [(sum(lengths), 0)]):
            self.assertEqual(hi, lo2)
            self.assertTrue(lo in ends and hi in ends)
            self.assertTrue(hi - lo <= 128 or (lo, hi) == (4, 204))

    def check_states(self, spec: str):
        model, tok = lora_policy(spec)
        g = LetterGrammar.for_tokenizer(tok)
        prompts = uneven_prompts(tok, g)
        letters = head_rows(model, mx.array(g.letter_ids))
        full = common_prefix_length(prompts)
        # the start's keys given, or in the stream; attention in numpy (CPU, float32) or in MLX (Metal, bfloat16)
        for shared, inline, on_numpy in ((full, False, True), (full, True, True), (full, True, False),
                                         (0, False, True)):
            segments = [p[shared:] for p in prompts]
            self.assertEqual(min(len(s) for s in segments), 1 if shared else len(prompts[-1]))
            prefix_kv = body_hidden(model, mx.array(prompts[0][:shared])[None], keep_kv=True)[1] if shared else None
            start = prompts[0][:shared] if inline else None       # and with LoRA folded (fold_lora says yes)
            with mock.patch.object(packed, "numpy_inference", packed.numpy_inference if on_numpy else lambda h: False):
                got, got_kv = packed_prefill(model, segments, None if inline else prefix_kv, shared, start,
                                             folded=inline and fold_lora(model))
            want, want_kv = padded_prefill(model, segments, prefix_kv, shared)
            if inline:                                  # the stream's keys begin with the start's
                self.assertEqual(got_kv[0][0].shape[2], shared + sum(len(s) for s in segments))
                want_kv = [tuple(mx.concatenate([p, w], axis=2) for p, w in zip(pkv, wkv))
                           for pkv, wkv in zip(prefix_kv, want_kv)]
            logits, ref = np.array(got @ letters.T), np.array(want @ letters.T)
            atol = rounding_tolerance(1e-5, float(np.abs(ref).max()), SPLIT_PROMPT_ULPS)
            np.testing.assert_allclose(logits, ref, rtol=0, atol=atol,
                                       err_msg=f"{spec} shared {shared} {inline} {on_numpy}: letter logits")
            for i, ((k, v), (k_ref, v_ref)) in enumerate(zip(got_kv, want_kv)):
                for x, y, what in ((k, k_ref, "keys"), (v, v_ref, "values")):
                    y = np.array(y)
                    np.testing.assert_allclose(np.array(x), y, rtol=0, atol=F32_RTOL * 10 * float(np.abs(y).max()),
                                               err_msg=f"{spec} shared {shared} {inline} {on_numpy} block {i} {what}")

    def check_decoding(self, spec: str):
        model, tok = lora_policy(spec)
        g = LetterGrammar.for_tokenizer(tok)
        prompts = [p[:-len(g.open + g.sep)] for p in uneven_prompts(tok, g)]
        boards = BOARDS + [[]]
        for mode in ("grammar", "words"):
            for temperature in (0.0, 1.0):
                cfg = SamplingConfig(temperature=temperature, seed=4)
                replies = {}
                for name in ("packed", "one at a time"):
                    mx.random.seed(4)
                    generate = BatchedGenerator(model, tok, mode=mode, words=WORDS)
                    with mock.patch.object(letter_decoder, "packed_prefill",
                                           letter_decoder.packed_prefill if name == "packed" else padded_prefill):
                        replies[name] = generate(prompts, cfg, excluded=boards)
                for i, (a, b) in enumerate(zip(replies["packed"], replies["one at a time"])):
                    self.assertEqual(a.text, b.text, f"{spec} {mode} T={temperature} prompt {i}")
                    scale = float(np.abs(b.logprobs).max()) + 30.0        # the logits' size, not the log-prob's
                    atol = rounding_tolerance(1e-5, scale, SPLIT_PROMPT_ULPS)
                    np.testing.assert_allclose(a.logprobs, b.logprobs, rtol=0, atol=atol,
                                               err_msg=f"{spec} {mode} T={temperature} prompt {i}")

    def test_tiny_model(self):                       # a character tokenizer: a forced separator before each letter
        self.check_states("builtin:tiny-random")
        self.check_decoding("builtin:tiny-random")

    def test_gemma_270m(self):
        self.check_states("builtin:gemma-3-270m")
        self.check_decoding("builtin:gemma-3-270m")


class FoldedLoraTest(unittest.TestCase):
    """LoRA folded into the weights for decoding on the CPU: the same outputs as the LoRA layers to float32
    rounding, remade when a LoRA weight changes (a GRPO update), and not made for another dtype or over the limit."""

    def test_folded_layers_give_the_lora_layers_outputs_and_follow_their_weights(self):
        model, _ = lora_policy("builtin:tiny-random")
        attn = text_model(model).model.layers[0].self_attn
        modules = [attn.q_proj, attn.k_proj, attn.v_proj]
        x = mx.random.normal((3, 7, modules[0].linear.weight.shape[1]))
        for change in (False, True):
            if change:                                 # as an update does: new LoRA arrays, the fold remade
                modules[0].lora_b = modules[0].lora_b + 0.5
            self.assertTrue(fold_lora(model))
            for got, want in zip(projections(x, modules, folded=True), [m(x) for m in modules]):
                want = np.array(want)
                atol = F32_RTOL * 64 * float(np.abs(want).max())
                np.testing.assert_allclose(np.array(got), want, rtol=0, atol=atol, err_msg=f"changed {change}")

    def test_no_fold_over_the_limit_or_in_bfloat16(self):
        model, _ = lora_policy("builtin:tiny-random")
        with mock.patch.object(packed, "FOLD_LIMIT_BYTES", 0):
            self.assertFalse(fold_lora(model))
        model, _ = lora_policy("builtin:tiny-random", "bfloat16")
        self.assertFalse(fold_lora(model))


class BatchIndependenceTest(unittest.TestCase):
    """Greedy replies do not depend on which other games share the batch: the letters are the same and the
    log-probs agree to float32 rounding of the logits' size."""

    def check(self, spec: str):
        model, tok = lora_policy(spec)
        prompts = board_prompts(tok)
        for mode in ("grammar", "words"):
            generate = BatchedGenerator(model, tok, mode=mode, words=WORDS)
            everyone = generate(prompts, SamplingConfig(), excluded=BOARDS)
            keep = [0, 2, 3, 5]                      # games 1 and 4 ended
            rest = generate([prompts[i] for i in keep], SamplingConfig(), excluded=[BOARDS[i] for i in keep])
            for i, reply in zip(keep, rest):
                self.assertEqual(reply.text, everyone[i].text, f"{spec} {mode} game {i}")
                scale = float(np.abs(reply.logprobs).max()) + 30.0        # the logits' size, not the log-prob's
                np.testing.assert_allclose(reply.logprobs, everyone[i].logprobs, rtol=0,
                                           atol=rounding_tolerance(1e-5, scale), err_msg=f"{spec} {mode} game {i}")

    def test_tiny_model(self):                       # a character tokenizer: a forced separator before each letter
        self.check("builtin:tiny-random")

    def test_gemma_270m(self):
        self.check("builtin:gemma-3-270m")


class MultiPromptUpdateTest(unittest.TestCase):
    def test_several_prompts_in_one_micro_batch_give_the_same_loss_and_gradients(self):
        """Replies to 4 boards packed in one micro-batch (the system prompt the boards share runs once, the boards'
        rests together after it, each reply attends to its own prompt) against one micro-batch a board: the same
        loss, and the same gradient to float32 rounding."""
        model, tok = lora_policy("builtin:gemma-3-270m")
        prompts = board_prompts(tok)[:4]
        rows = [i for i in range(4) for _ in range(3)]
        replies = BatchedGenerator(model, tok, mode="grammar")([prompts[i] for i in rows],
                                                               SamplingConfig(temperature=1.0, seed=1))
        seqs = [reply_sequence(prompts[i], c.tokens, c.logprobs, c.choice) for i, c in zip(rows, replies)]
        letters = LetterChoices(LetterGrammar.for_tokenizer(tok))
        weights = averaging_weights([sum(q.mask) for q in seqs])
        adv = [float(a) for a in np.random.default_rng(0).normal(size=len(seqs))]
        model.train()
        value_and_grad = nn.value_and_grad(model, lambda a: grpo_loss(model, a, LossSettings(letters=letters))[0])
        groups, rest = shared_prompt_groups(seqs, 256)
        self.assertEqual((len(groups), rest), (4, []))
        merged = merge_prompt_groups(groups, seqs, max_tokens=4096, max_loss_tokens=256)
        self.assertEqual(merged, [list(range(12))])
        together = batch_arrays(pack_shared_batch(seqs, adv, weights), letters)
        self.assertIsInstance(together["prefix"], tuple)
        self.assertEqual(len(together["prefix"]), 4)          # the system prompt they share runs once
        loss, grads = value_and_grad(together)
        total, summed = 0.0, None
        for idx in groups:
            one = batch_arrays(pack_shared_batch([seqs[k] for k in idx], [adv[k] for k in idx],
                                                 [weights[k] for k in idx]), letters)
            part_loss, part = value_and_grad(one)
            total += part_loss.item()
            part = flat(part)
            summed = part if summed is None else {k: summed[k] + part[k] for k in part}
        model.eval()
        scale = sum(abs(a) for a in adv) / len(adv)
        self.assertLessEqual(abs(loss.item() - total), 10 * F32_RTOL * scale)
        for k, g in flat(grads).items():
            size = float(mx.abs(summed[k]).max())
            self.assertLessEqual(float(mx.abs(g - summed[k]).max()), 1e-4 * size + 1e-12, k)

    def test_the_packed_stream_gives_the_padded_prompts_log_probs(self):
        """The update's stream (the shared start once, then each prompt's rest and its replies, no padding) against
        the padded prompts with a key gather per row (`multi_prefix_logits`): the same log-probs, and the same
        gradient, within float32 rounding of the logits' size, for replies of very different lengths (two of a
        single token) scored over the vocabulary and as letter choices, with the prompts' start shared or not."""
        model, tok = lora_policy("builtin:tiny-random")
        prompts = board_prompts(tok)[:4]
        rng = np.random.default_rng(0)
        lengths = [1, 7, 3, 12, 2, 5, 9, 1]
        letters = LetterChoices(LetterGrammar.for_tokenizer(tok))
        ids = np.array(letters.grammar.letter_ids)
        replies = [[int(t) for t in rng.choice(ids, size=n)] for n in lengths]
        weights = averaging_weights(lengths)
        adv = [float(a) for a in rng.normal(size=len(lengths))]
        for start in (True, False):
            # without a shared start, the prompts differ from their second token on
            heads = [p if start else p[:1] + [100 + k] + p[1:] for k, p in enumerate(prompts)]
            batch = pack_shared_batch([reply_sequence(heads[k % 4], r, [0.0] * len(r)) for k, r in enumerate(replies)],
                                      adv, weights)
            self.assertEqual(batch.prefix_start is not None, start)
            for scoring in (None, letters):
                arrays = batch_arrays(batch, scoring)
                self.assertIsNotNone(arrays["packed"])
                padded = {k: v for k, v in arrays.items() if k != "packed"}
                model.train()
                got, want = policy_logprobs(model, arrays, 1.0), policy_logprobs(model, padded, 1.0)
                loss = lambda a: grpo_loss(model, a, LossSettings(letters=scoring))[0]      # noqa: E731
                g_got = flat(nn.value_and_grad(model, lambda: loss(arrays))()[1])
                g_want = flat(nn.value_and_grad(model, lambda: loss(padded))()[1])
                model.eval()
                self.assertEqual(got.shape, want.shape)
                size = float(mx.abs(want).max()) + 1.0
                self.assertLessEqual(float(mx.abs(got - want).max()), 64 * F32_RTOL * size, (start, scoring))
                for k, g in g_got.items():
                    scale = float(mx.abs(g_want[k]).max())
                    self.assertLessEqual(float(mx.abs(g - g_want[k]).max()), 1e-4 * scale + 1e-12, (start, scoring, k))

    def test_micro_batches_respect_the_token_limits(self):
        model, tok = lora_policy("builtin:gemma-3-270m")
        prompts = board_prompts(tok)
        seqs = [reply_sequence(p, p[-3:] + [10, 11, 12, 13, 14], [0.0] * 8, [0, 0, 0, 1, 1, 1, 1, 1])
                for p in prompts for _ in range(4)]
        groups, _ = shared_prompt_groups(seqs, 256)
        for max_loss in (20, 45, 1000):
            merged = merge_prompt_groups(groups, seqs, max_tokens=4096, max_loss_tokens=max_loss)
            self.assertEqual(sorted(i for m in merged for i in m), list(range(len(seqs))))
            for m in merged:
                if len(m) > 4:                       # more than one prompt's group
                    self.assertLessEqual(sum(sum(seqs[i].mask) for i in m), max_loss)


class LastBlocksGradientTest(unittest.TestCase):
    def test_training_the_last_blocks_gives_them_the_full_backward_gradients(self):
        """With the LoRA of every block but the last 2 frozen, the update's gradient (whose backward pass stops at
        the first block that trains) holds only those 2 blocks, equal to theirs in a full backward pass."""
        model, tok = lora_policy("builtin:tiny-random")
        prompts = board_prompts(tok)[:2]
        replies = BatchedGenerator(model, tok)([p for p in prompts for _ in range(2)],
                                               SamplingConfig(temperature=1.0, seed=2, max_tokens_per_turn=6))
        seqs = [reply_sequence(p, c.tokens, c.logprobs) for p, c in zip([p for p in prompts for _ in range(2)],
                                                                         replies)]
        batch = batch_arrays(pack_shared_batch(seqs, [1.0, -1.0, 0.5, -0.5],
                                               averaging_weights([sum(q.mask) for q in seqs])))
        value_and_grad = nn.value_and_grad(model, lambda a: grpo_loss(model, a, LossSettings())[0])
        model.train()
        _, full = value_and_grad(batch)
        blocks = len(model.layers)
        freeze_lora_below(model, 2)
        _, last = value_and_grad(batch)
        model.eval()
        full, last = flat(full), flat(last)
        trained = {f"layers.{i}." for i in range(blocks - 2, blocks)}
        self.assertTrue(last)
        for k, g in last.items():
            self.assertTrue(any(t in k for t in trained), f"{k} should be frozen")
            self.assertTrue(mx.array_equal(g, full[k]).item() or
                            float(mx.abs(g - full[k]).max()) <= F32_RTOL * float(mx.abs(full[k]).max()), k)
        self.assertEqual(len(last), sum(1 for k in full if any(t in k for t in trained)))


if __name__ == "__main__":
    unittest.main()
