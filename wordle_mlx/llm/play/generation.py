"""Batched sampling of completions for many prompts at once, on top of mlx-lm's `BatchGenerator`.

`BatchedGenerator(model, tokenizer)(prompts, cfg)` takes a list of prompt token-id lists and returns one
`Completion` per prompt (token ids, the log-probability of each sampled token, decoded text, and finish
reason). All prompts go into one `mlx_lm.generate.BatchGenerator`, which prefills them in batches of
`prefill_batch_size` and decodes up to `completion_batch_size` sequences per forward step. A sequence
stops on an end token (the tokenizer's EOS ids and `<end_of_turn>`; the end token is kept as the last
completion token, as TRL does, so the policy learns to stop), as soon as its decoded text contains a stop
text (`</guess>`: checked on the decoded text, because the Gemma vocabulary may split it into several
tokens; the sequence is then removed from the batch at once), or after `max_tokens_per_turn` tokens
(finish reason "length"). KV reuse: the longest token prefix shared by all prompts (at least the system
prompt) is prefilled once at batch size 1 and its cache is shared read-only by every sequence, and a
prompt that occurs several times (G samples of one state) is prefilled once for all its samples (they
share that cache read-only too: mlx-lm copies caches when it merges them into a batch). Nothing is reused across
calls or turns (each turn's prompt is a fresh chat-template rendering).
Log-prob convention: see `policy_logprob_temperature`. Sampling at a temperature with no top-p/top-k/
min-p filter uses `inverse_cdf_sampler` on CPU: the same categorical distribution as mlx-lm's sampler
(a cumulative sum in float64 and one MLX-seeded uniform per row), cheaper over Gemma's 262k-token
vocabulary, where MLX draws noise for every entry (`benchmarks/sampler.py` compares the two). With
`mode="grammar"` or `"words"` (reply_grammar.py) BatchGenerator is not used: the letters-format reply's tags are
forced and its 5 letters are picked on the 26 letter rows by `letter_decoder.decode_letters` (top-p, top-k and
min-p are free decoding's only); a `Completion` then marks which tokens were chosen (`choice`) and gives forced
tokens log-prob 0; in words decoding `excluded` names
each prompt's board words, which are never spelled again. Any callable with the `GenerateFn`
signature can stand in for the model (tests use scripted ones).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Callable, Collection, Sequence

import mlx.core as mx
import numpy as np
from mlx_lm.generate import BatchGenerator
from mlx_lm.models.cache import make_prompt_cache
from mlx_lm.sample_utils import make_sampler
from pydantic import Field

from ...config import StrictModel
from ...errors import UserError
from ...runtime import device
from .letter_decoder import LetterPolicy, decode_letters
from .reply_grammar import LetterGrammar, WordTrie
from .tokens import common_prefix_length, end_token_ids, reply_end_id

STOP_TEXTS = ("</guess>",)
MIN_SHARED_PREFIX = 8           # shorter common prefixes are not worth a separate forward pass


class SamplingConfig(StrictModel):
    temperature: float = Field(0.0, ge=0.0, description="0 = greedy (argmax).")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="Nucleus sampling; 1 = off.")
    top_k: int = Field(0, ge=0, description="Keep the k most likely tokens; 0 = off.")
    min_p: float = Field(0.0, ge=0.0, lt=1.0, description="Min-p filter; 0 = off.")
    max_tokens_per_turn: int = Field(256, ge=1, description="Completion length cap; hitting it is finish 'length'.")
    prefill_batch_size: int = Field(8, ge=1, description="Prompts prefilled together.")
    completion_batch_size: int = Field(32, ge=1, description="Sequences decoded together per forward step.")
    prefill_step_size: int = Field(2048, ge=16, description="Prompt tokens per prefill forward pass.")
    reuse_prefix: bool = Field(True, description="Prefill the shared prompt prefix once and share its KV cache.")
    seed: int = Field(0, ge=0, lt=2 ** 32, description="Seed of MLX's sampling RNG (set once per play_games/sample_replies call).")


@dataclass
class Completion:
    tokens: list[int]            # sampled token ids, the end token included when the sequence ended on one
    logprobs: list[float]        # one per token, see policy_logprob_temperature (0 for a forced token)
    text: str                    # decoded tokens, end tokens left out
    finish_reason: str           # "stop" (end token or stop text) or "length"
    choice: list[int] | None = None   # grammar decoding: 1 where a token was decoded, 0 where it was forced


GenerateFn = Callable[[Sequence[Sequence[int]], SamplingConfig], list[Completion]]


def policy_logprob_temperature(cfg: SamplingConfig) -> float:
    """The temperature T of the recorded log-probs: log p(token) = log_softmax(logits / T)[token].

    T is the sampling temperature, or 1 when sampling is greedy (temperature 0). Top-p/top-k/min-p
    truncation is NOT applied (the TRL convention): the log-prob is that of the model policy at
    temperature T, so the GRPO trainer recomputes new log-probs with `policy_logprobs(logits, tokens, T)`
    and the ratio is exact when sampling used no truncation.
    """
    return float(cfg.temperature) if cfg.temperature > 0 else 1.0


def policy_logprobs(logits, tokens, temperature: float):
    """log_softmax(logits / temperature) at `tokens` (logits [..., V], tokens [...]) in float32."""
    scaled = logits.astype(mx.float32) / temperature
    logp = scaled - mx.logsumexp(scaled, axis=-1, keepdims=True)
    return mx.take_along_axis(logp, mx.expand_dims(tokens, -1), axis=-1).squeeze(-1)


def inverse_cdf_sampler(temperature: float):
    """A sampler for BatchGenerator: token ~ softmax(logprobs / temperature) per row, by inverse CDF."""
    def sample(logprobs):
        mx.eval(logprobs)
        x = np.asarray(logprobs.astype(mx.float32)) / temperature
        u = np.asarray(mx.random.uniform(shape=(x.shape[0], 1)), dtype=np.float64)
        cdf = np.cumsum(np.exp(x - x.max(axis=-1, keepdims=True)), axis=-1, dtype=np.float64)
        idx = (cdf < u * cdf[:, -1:]).sum(axis=-1)      # first index whose cumulative mass reaches u
        return mx.array(np.minimum(idx, x.shape[-1] - 1).astype(np.uint32))

    return sample


def make_sampler_for(cfg: SamplingConfig):
    """mlx-lm's sampler for `cfg`, or the inverse-CDF one for plain temperature sampling on CPU."""
    plain = cfg.top_p >= 1.0 and cfg.top_k == 0 and cfg.min_p == 0.0
    if cfg.temperature > 0 and plain and not device.has_gpu():
        return inverse_cdf_sampler(cfg.temperature)
    return make_sampler(cfg.temperature, top_p=cfg.top_p if cfg.top_p < 1.0 else 0.0,
                        min_p=cfg.min_p, top_k=cfg.top_k)


class BatchedGenerator:
    """The MLX generation backend: `__call__(prompts, cfg) -> list[Completion]` (see module docstring)."""

    takes_boards = True       # rollouts pass each prompt's words on the board (`excluded`), which words decoding skips

    def __init__(self, model, tokenizer, stop_texts: Sequence[str] = STOP_TEXTS, mode: str = "free",
                 words: Collection[str] | None = None):
        self.model = model
        self.tokenizer = tokenizer
        self.stop_texts = tuple(s.lower() for s in stop_texts)
        self.end_ids = end_token_ids(tokenizer)
        self._last_chars = {s[-1] for s in self.stop_texts}
        self._piece_has_last: dict[int, bool] = {}
        self.prefilled_tokens = 0      # prompt tokens actually run through the model (for benchmarks)
        self.mode = mode               # reply_grammar.DECODE_MODES
        self.grammar = self.trie = None
        if mode != "free":
            self.grammar = LetterGrammar(tokenizer, reply_end_id(tokenizer, self.end_ids))
            if mode == "words":
                if words is None:
                    raise ValueError("words decoding needs the allowed words")
                self.trie = WordTrie(words)

    # -- KV reuse -------------------------------------------------------------------------------------
    def _prefill(self, tokens: Sequence[int], cache, step: int) -> None:
        for start in range(0, len(tokens), step):
            self.model(mx.array(list(tokens[start:start + step]))[None], cache=cache)
            mx.eval([c.state for c in cache])
        self.prefilled_tokens += len(tokens)

    def _prompt_caches(self, prompts: list[list[int]], cfg: SamplingConfig):
        """(inputs, caches): what each sequence still has to prefill, and its starting cache (or None)."""
        if not cfg.reuse_prefix or len(prompts) < 2:
            return prompts, None
        distinct = list(dict.fromkeys(tuple(p) for p in prompts))
        counts = {p: 0 for p in distinct}
        for p in prompts:
            counts[tuple(p)] += 1
        shared = min(common_prefix_length(distinct), min(len(p) for p in distinct) - 1)
        if shared < MIN_SHARED_PREFIX and all(n == 1 for n in counts.values()):
            return prompts, None
        base = make_prompt_cache(self.model)
        if shared > 0:
            self._prefill(distinct[0][:shared], base, cfg.prefill_step_size)
        own: dict[tuple, tuple[list[int], list]] = {}
        for p in distinct:
            if counts[p] > 1 and len(p) - 1 > shared:
                cache = copy.deepcopy(base)
                self._prefill(p[shared:-1], cache, cfg.prefill_step_size)
                own[p] = ([p[-1]], cache)
            else:
                own[p] = (list(p[shared:]), base)
        inputs, caches = [], []
        for p in prompts:
            rest, cache = own[tuple(p)]
            inputs.append(rest)
            caches.append(cache)          # merged into the batch cache by copying: read-only here
        return inputs, caches

    # -- stopping -------------------------------------------------------------------------------------
    def _may_end_stop_text(self, token: int) -> bool:
        hit = self._piece_has_last.get(token)
        if hit is None:
            piece = self.tokenizer.decode([token])
            hit = any(ch in piece for ch in self._last_chars) or not piece.isprintable()
            self._piece_has_last[token] = hit
        return hit

    def _text(self, tokens: list[int]) -> str:
        return self.tokenizer.decode([t for t in tokens if t not in self.end_ids])

    def _has_stop_text(self, tokens: list[int]) -> bool:
        if not self.stop_texts or not self._may_end_stop_text(tokens[-1]):
            return False
        text = self._text(tokens).lower()
        return any(s in text for s in self.stop_texts)

    # -- generation -----------------------------------------------------------------------------------
    def __call__(self, prompts: Sequence[Sequence[int]], cfg: SamplingConfig,
                 greedy: Sequence[bool] | None = None, greedy_logprobs_at_temperature: bool = False,
                 excluded: Sequence[Collection[str]] | None = None) -> list[Completion]:
        """One completion per prompt, sampled with `cfg`; where `greedy[i]` is true, prompt i is decoded
        greedily instead (in the same batch, so a prompt repeated for G samples and one greedy reply is
        prefilled once; its log-probs then follow the greedy convention, T = 1, or with
        `greedy_logprobs_at_temperature` the sampling temperature's, so the reply can be trained on beside
        the samples). In grammar and words modes only the reply's letters are decoded (letter_decoder.py); in words
        mode `excluded[i]` (the words on prompt i's board) are never spelled."""
        prompts = [list(p) for p in prompts]
        if not prompts:
            return []
        if any(len(p) == 0 for p in prompts):
            raise ValueError("empty prompt")
        if greedy is not None and len(greedy) != len(prompts):
            raise ValueError(f"greedy has {len(greedy)} flags for {len(prompts)} prompts")
        if excluded is not None and len(excluded) != len(prompts):
            raise ValueError(f"excluded has {len(excluded)} entries for {len(prompts)} prompts")
        self.model.eval()
        if self.grammar is not None:
            return self._letters(prompts, cfg, greedy, greedy_logprobs_at_temperature, excluded)
        sampler = make_sampler_for(cfg)
        temperature = policy_logprob_temperature(cfg)
        samplers = None
        if greedy is not None and any(greedy) and cfg.temperature > 0:
            argmax = make_sampler_for(cfg.model_copy(update={"temperature": 0.0}))
            samplers = [argmax if g else sampler for g in greedy]
        greedy_rows = {i for i, g in enumerate(greedy or ()) if g}
        inputs, caches = self._prompt_caches(prompts, cfg)
        if caches is None:
            self.prefilled_tokens += sum(len(p) for p in prompts)
        else:
            self.prefilled_tokens += sum(len(p) for p in inputs)
        gen = BatchGenerator(self.model, max_tokens=cfg.max_tokens_per_turn,
                             stop_tokens=[[t] for t in sorted(self.end_ids)], sampler=sampler,
                             completion_batch_size=cfg.completion_batch_size,
                             prefill_batch_size=cfg.prefill_batch_size, prefill_step_size=cfg.prefill_step_size)
        try:
            uids = gen.insert(inputs, caches=caches, samplers=samplers)
            index = {uid: i for i, uid in enumerate(uids)}
            tokens: list[list[int]] = [[] for _ in prompts]
            logprobs: list[list[float]] = [[] for _ in prompts]
            finish: list[str | None] = [None] * len(prompts)
            while (responses := gen.next_generated()):
                rows = mx.stack([r.logprobs for r in responses])
                picked = mx.array([r.token for r in responses])
                raw = mx.take_along_axis(rows, picked[:, None], axis=-1)[:, 0]  # rows are log_softmax(logits)
                values = (policy_logprobs(rows, picked, temperature) if temperature != 1.0 else raw).tolist()
                if samplers is not None and temperature != 1.0 and not greedy_logprobs_at_temperature:
                    raw = raw.tolist()
                    values = [raw[k] if index[r.uid] in greedy_rows else v
                              for k, (r, v) in enumerate(zip(responses, values))]
                done_early = []
                for r, value in zip(responses, values):
                    i = index[r.uid]
                    tokens[i].append(int(r.token))
                    logprobs[i].append(float(value))
                    if r.finish_reason == "stop":
                        finish[i] = "stop"
                    elif self._has_stop_text(tokens[i]):
                        finish[i] = "stop"
                        if r.finish_reason is None:
                            done_early.append(r.uid)
                    elif r.finish_reason is not None:
                        finish[i] = r.finish_reason
                if done_early:
                    gen.remove(done_early)
        finally:
            gen.close()
        return [Completion(t, lp, self._text(t), f or "length") for t, lp, f in zip(tokens, logprobs, finish)]

    # -- grammar and words decoding -------------------------------------------------------------------
    def _letters(self, prompts: list[list[int]], cfg: SamplingConfig, greedy: Sequence[bool] | None,
                 greedy_logprobs_at_temperature: bool, excluded: Sequence[Collection[str]] | None = None
                 ) -> list[Completion]:
        """Replies whose tags are forced and whose 5 letters are picked over the 26 letter tokens: greedily
        (argmax, no softmax over anything but the letters) or sampled from softmax(logits / T) over the allowed
        letters; in words mode letters that continue no allowed word off the row's board are never allowed."""
        g = self.grammar
        temperature = policy_logprob_temperature(cfg)
        sampled = cfg.temperature > 0
        if sampled and (cfg.top_p < 1.0 or cfg.top_k > 0 or cfg.min_p > 0.0):
            raise UserError(f"top_p, top_k and min_p apply to free decoding only; {self.mode} decoding samples the "
                            f"letters from the whole renormalised distribution (got top_p {cfg.top_p}, top_k "
                            f"{cfg.top_k}, min_p {cfg.min_p})")
        greedy_rows = np.array([bool(x) for x in greedy] if greedy is not None else [False] * len(prompts))
        if not sampled:
            greedy_rows[:] = True
        at_temperature = np.where(greedy_rows & sampled & (not greedy_logprobs_at_temperature), 1.0, temperature)
        policy = LetterPolicy(cfg.temperature if sampled else 0.0, greedy_rows, at_temperature.astype(np.float32),
                              self.trie, excluded)
        lead = [p + g.open + g.sep for p in prompts]
        letters, logprobs, ran = decode_letters(self.model, g, lead, policy, cfg.completion_batch_size)
        self.prefilled_tokens += ran
        out = []
        for word, lps in zip(letters, logprobs):
            tokens, choice = g.reply(word)
            it = iter(lps)
            out.append(Completion(tokens, [next(it) if c else 0.0 for c in choice], self._text(tokens), "stop",
                                  choice))
        return out
