"""Guided GRPO groups: one off-policy reply per tight board, the fitting answer the model itself likes best.

GRPO can only reinforce what its samples contain: a reply the policy never samples (a word it cannot spell)
gets no gradient, and a group whose G samples all fail is dropped. Off-policy guidance (LUFFY, Yan et al.
2025) adds a good reply to such groups. Here the added reply is the label `wordle-mlx choice` would give the
board: among the answers that fit every clue so far (the candidates), the one whose reply the model scores
highest by sequence log-probability (`candidate_scores.reply_token_logprobs`, the prompt run once), or the only
candidate. It is built only on boards with at most `max_candidates` candidates (the end game, where session 32
found most games lost to non-words with only the secret left; scoring hundreds of candidates on early boards
would cost more than the step). The reply's tokens are the chat template's assistant turn up to and including
its end token, which is what SFT trained on and what sampling stops on, and its log-probs are the current
policy's at the sampling temperature, so it enters the GRPO loss like a sample (importance ratio 1 at the
rollout's weights). It is scored by the same reward as the samples; it is never played. Guidance reads only
the board and the answer list, as `choice` does, never the secret.
"""

from __future__ import annotations

from typing import Sequence

from ..game.knowledge import candidates
from ..game.state import GameState
from ..game.words import answers
from .candidate_scores import reply_token_ids, reply_token_logprobs
from .generation import Completion, end_token_ids, policy_logprob_temperature
from .prompts import TurnText, format_reply
from .rollout import RolloutConfig, prompt_messages


class GuideReplies:
    """`guide(state, prompt_ids, texts, turn_errors)`: the guided reply for this board as a `Completion`, or None
    when more than `max_candidates` answers fit (or none does)."""

    def __init__(self, model, tokenizer, cfg: RolloutConfig, max_candidates: int, words: Sequence[str] | None = None,
                 chunk: int = 32):
        if max_candidates < 1:
            raise ValueError(f"max_candidates must be >= 1, got {max_candidates}")
        self.model, self.tokenizer, self.cfg = model, tokenizer, cfg
        self.max_candidates, self.chunk = max_candidates, chunk
        self.words = list(words) if words is not None else answers()
        self.end_ids = end_token_ids(tokenizer)
        self.temperature = policy_logprob_temperature(cfg)
        self.guided = 0                   # boards given a guided reply so far

    def reply_ids(self, messages: list[dict], prompt_ids: Sequence[int], word: str) -> list[int]:
        text = format_reply(None, word, False, self.cfg.prompt.guess_format)
        ids = reply_token_ids(self.tokenizer, messages, text, prompt_ids)
        ends = [i for i, t in enumerate(ids) if t in self.end_ids]
        if not ends:
            raise ValueError(f"the chat template's reply for {word!r} has no end token")
        return ids[:ends[0] + 1]

    def __call__(self, state: GameState, prompt_ids: Sequence[int], texts: Sequence[TurnText] = (),
                 turn_errors: Sequence[tuple[str, str | None]] = ()) -> Completion | None:
        fitting = candidates(self.words, state.history())
        if not fitting or len(fitting) > self.max_candidates:
            return None
        messages = prompt_messages(self.cfg, state, texts, turn_errors)
        replies = [self.reply_ids(messages, prompt_ids, w) for w in fitting]
        token_lps = reply_token_logprobs(self.model, prompt_ids, replies, self.temperature, self.chunk)
        best = max(range(len(fitting)), key=lambda i: (float(token_lps[i].sum()), -i))   # ties: answer-list order
        self.guided += 1
        text = format_reply(None, fitting[best], False, self.cfg.prompt.guess_format)
        return Completion(replies[best], [float(x) for x in token_lps[best]], text, "stop")
