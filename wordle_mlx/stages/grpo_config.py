"""The `wordle-mlx train` (GRPO) configuration: strict pydantic sections loaded from `config/grpo*.json`.

One section per concern: `model` (base model and an optional SFT adapter to continue), `lora` (layout of fresh
LoRA layers), `training` (steps, B prompts per step, optimizer and schedule, micro-batch sizes, checkpoints),
`rl` (episode or turn mode, G, sampling, game rules, prompt format), `grpo` (clipping, KL, averaging,
advantages), `reward` (`game/rewards.py` weights, checked against the mode's invariant when the config is
loaded), `prompts` (where the B boards come from), `anchor` (an optional SFT term added to every step) and
`validation`. Every section forbids unknown keys, so a
misspelt field is a one-line error naming the file and the field.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from ..config import MODEL_SPEC_HELP, StrictModel
from ..game.rewards import RewardWeights
from ..game.seeding import HistoryPolicy
from ..llm.prompts import PromptConfig


class ModelSection(StrictModel):
    name: str = Field("builtin:gemma-3-270m", description=MODEL_SPEC_HELP)
    adapter: str | None = Field(None, description="SFT adapter folder to start from (relative to the config file).")
    dtype: str | None = None


class LoraSection(StrictModel):
    rank: int = Field(8, ge=1, description="Ignored with model.adapter (the adapter's own rank applies).")
    scale: float = Field(20.0, gt=0, description="Ignored with model.adapter (the adapter's own scale applies).")
    dropout: float = Field(0.0, ge=0, lt=1)
    num_layers: int = Field(-1, ge=-1, description="Last N blocks get LoRA; -1 = all. Ignored with model.adapter.")
    keys: list[str] | None = Field(None, description="Ignored with model.adapter (the adapter's own keys apply).")
    train_layers: int | None = Field(None, ge=1, description=(
        "With model.adapter: only the LoRA weights of the last N blocks train; the others keep the adapter's "
        "values (and still act). None: all of the adapter's LoRA weights train."))


class TrainingSection(StrictModel):
    steps: int = Field(100, ge=1)
    batch_prompts: int = Field(2, ge=1, description="B: prompts per step.")
    learning_rate: float = Field(1e-5, gt=0)
    warmup_steps: int = Field(0, ge=0)
    min_learning_rate: float = Field(0.0, ge=0)
    optimizer: Literal["adamw", "sgd"] = Field("adamw", description=(
        "adamw moves every weight by about the learning rate; sgd moves each weight in proportion to its clipped "
        "gradient: without momentum a step's norm is learning_rate x min(grad norm, max_grad_norm). Measured "
        "(docs/RESULTS.md, sessions 33-34): 8 GRPO steps from a 73 / 200 SFT player won 46 with adamw at 1e-5 "
        "and 65 with sgd at 0.02 (62 with four times the boards a step)."))
    momentum: float = Field(0.0, ge=0, lt=1, description="sgd only: heavy-ball momentum.")
    weight_decay: float = Field(0.0, ge=0)
    max_grad_norm: float = Field(1.0, ge=0, description="0 = no clipping.")
    max_tokens_per_microbatch: int = Field(2048, ge=16, description="Padded tokens per forward/backward pass.")
    max_loss_tokens_per_microbatch: int = Field(256, ge=1, description="Model tokens per pass (vocab-sized logits each).")
    grad_checkpoint: bool = Field(False, description="Recompute each block's activations in the update's backward "
                                  "pass (less memory, about one more forward of compute), as sft's grad_checkpoint.")
    checkpoint_every: int = Field(10, ge=0, description="0 = only at the end.")
    keep_checkpoints: int = Field(3, ge=1)
    max_nonfinite_in_a_row: int = Field(3, ge=1, description="Stop after this many non-finite steps in a row.")
    seed: int = Field(0, ge=0, lt=2 ** 32)

    @model_validator(mode="after")
    def _check_momentum(self) -> "TrainingSection":
        if self.momentum and self.optimizer != "sgd":
            raise ValueError(f"momentum is for optimizer 'sgd', got optimizer {self.optimizer!r} and momentum "
                             f"{self.momentum}")
        return self


class RLSection(StrictModel):
    mode: Literal["episode", "turn"] = "episode"
    num_generations: int = Field(8, ge=2, description="G: games (episode) or replies (turn) per group.")
    max_completion_tokens: int = Field(128, ge=1)
    temperature: float = Field(1.0, gt=0)
    max_turns: int = Field(6, ge=1, le=6, description="Guesses per game.")
    max_invalid_replies: int = Field(3, ge=1)
    invalid_costs_turn: bool = False
    turn_continue: Literal["best", "sampled", "greedy"] = Field(
        "best", description="Turn mode: play on with the best-scoring of the G replies, with one sampled reply, or "
        "with the policy's greedy reply (one more decode per turn; the boards are the ones greedy eval reaches).")
    train_greedy: bool = Field(False, description=(
        "Turn mode with turn_continue 'greedy': the greedy reply also joins its group as member G + 1 and is "
        "trained on, so each update pushes the reply greedy play gives up or down."))
    turn_reward: Literal["immediate", "greedy_return", "greedy_return_strict"] = Field("immediate", description=(
        "Turn mode: 'immediate' scores win and early only when the reply itself wins; 'greedy_return' plays each "
        "distinct reply's game on to its end greedily (temperature 0, the current policy, after all turns in one "
        "lockstep batch) and scores win and early by how that game ends, so a reply is worth what greedy play "
        "makes of it (Monte-Carlo values as in VinePPO, exact because greedy play is deterministic); the other "
        "components still score the reply itself. Costs one more greedy game per distinct reply. "
        "'greedy_return_strict': the same, but in the played-on game a rejected reply, the scored one included, "
        "uses up a guess and counts as one in early (the game's own rules let a rejected reply cost nothing). "
        "With turn_continue 'best', the reply the main game goes on with is still picked by the immediate reward "
        "(the returns are known only after the last turn)."))
    guide: Literal["none", "choice"] = Field("none", description=(
        "Turn mode: 'choice' adds one off-policy reply to the group of every board where at most "
        "guide_max_candidates answers fit: the fitting answer the model scores highest, as `wordle-mlx choice` "
        "labels a board (LUFFY-style guidance); it is scored and trained on like a sample, never played."))
    guide_max_candidates: int = Field(32, ge=1, description="Guided boards have at most this many fitting answers.")
    completion_batch_size: int = Field(64, ge=1)
    prompt: PromptConfig = Field(default_factory=PromptConfig)

    @model_validator(mode="after")
    def _check_train_greedy(self) -> "RLSection":
        if self.train_greedy and (self.mode, self.turn_continue) != ("turn", "greedy"):
            raise ValueError(f"train_greedy needs mode 'turn' and turn_continue 'greedy', got mode {self.mode!r} "
                             f"and turn_continue {self.turn_continue!r}")
        if self.guide != "none" and self.mode != "turn":
            raise ValueError(f"guide {self.guide!r} needs mode 'turn', got mode {self.mode!r}")
        if self.turn_reward != "immediate" and self.mode != "turn":
            raise ValueError(f"turn_reward {self.turn_reward!r} needs mode 'turn', got mode {self.mode!r}")
        return self


class PromptsSection(StrictModel):
    source: Literal["generate", "file"] = "generate"
    path: str | None = Field(None, description="rl_train.jsonl from `wordle-mlx data` when source is 'file'.")
    k_weights: list[float] = Field([0.2, 0.2, 0.2, 0.2, 0.2], description="P(k seeded guesses), k = 0, 1, ...")
    solver: float = 0.4
    random: float = 0.45
    mistake: float = 0.15

    @model_validator(mode="after")
    def _check(self) -> "PromptsSection":
        if self.source == "file" and not self.path:
            raise ValueError("prompts.path is required when prompts.source is 'file'")
        HistoryPolicy(tuple(self.k_weights), self.solver, self.random, self.mistake)
        return self


class GRPOSection(StrictModel):
    epsilon: float = Field(0.2, gt=0, lt=1)
    epsilon_high: float | None = Field(None, gt=0)
    beta: float = Field(0.0, ge=0, description="KL weight to the reference policy (see `reference`).")
    reference: Literal["base", "start"] = Field("base", description=(
        "KL reference: 'base', the model with LoRA switched off; 'start', the policy the run started from "
        "(model.adapter's weights, or the fresh LoRA, which equals the base model), kept as a copy of the LoRA "
        "weights, so beta pulls against drift away from the SFT policy."))
    averaging: Literal["token", "sequence"] = "token"
    advantage: Literal["normalized", "centered", "prefix", "expected"] = Field("normalized", description=(
        "'normalized': GRPO, (r - mean) / std within a group; 'centered': r - mean (Dr. GRPO); 'prefix' (turn "
        "mode): per token, the change in the mean reward of the group's replies that share the prefix up to "
        "and including it, over the group std, so tokens all replies share get 0 (llm/advantages.py "
        "prefix_advantages; measured in docs/RESULTS.md, session 33: 58 and 51 / 200 from SFT starts of 63 and "
        "73, where 'normalized' gave 57 and 46); 'expected': minimum "
        "risk training (Shen et al. 2016) over each group's distinct replies, each weighted by its probability "
        "renormalised over the group (p ** expected_sharpness), so the update is the exact gradient of the "
        "expected reward over that set: an unlikely sample moves the policy little. Needs averaging 'token' "
        "(a reply's log-prob is the sum of its tokens'). Measured (docs/RESULTS.md, session 28): from the shipped "
        "adapter it lost greedy wins step by step (45 -> 43, 36, 33 at steps 8, 16, 24) where GRPO on the same "
        "secrets gave 46 and 51."))
    expected_sharpness: float = Field(1.0, gt=0, le=10, description=(
        "'expected' advantages: Q(y) is proportional to p(y) ** expected_sharpness; 1 = the policy's own "
        "probabilities, smaller values flatten Q toward uniform over the distinct replies."))
    resample_zero_variance: int = Field(0, ge=0, description="Rounds of fresh prompts to replace zero-variance groups.")
    unplayable_advantage: float = Field(0.0, ge=-5.0, le=0.0, description=(
        "Advantage of every reply in a zero-variance group where no reply played a word (all non-words or "
        "format errors); 0 = plain GRPO, which skips such groups; e.g. -1 pushes them down."))


    positive_only: bool = Field(False, description=(
        "Train only on replies whose advantage is above 0, the rest get 0 (self-imitation learning, Oh et al. "
        "2018): the update pulls up the better replies of a group and never pushes a reply down. Measured (docs/RESULTS.md, "
        "session 28): from the shipped adapter it won 50 / 200 at steps 8 and 12 and 42 at step 24 (45 at the "
        "start; all within noise)."))

    @model_validator(mode="after")
    def _check_expected(self) -> "GRPOSection":
        if self.positive_only and self.unplayable_advantage < 0:
            raise ValueError(f"positive_only drops negative advantages, so unplayable_advantage "
                             f"{self.unplayable_advantage} would do nothing; set it to 0")
        if self.advantage == "expected" and self.averaging != "token":
            raise ValueError(f"advantage 'expected' needs averaging 'token', got {self.averaging!r}")
        return self


class AnchorSection(StrictModel):
    data: str | None = Field(None, description="An SFT data folder (`wordle-mlx data` or `choice` output; its "
                             "train.jsonl), relative to the config file. Each step then adds `weight` x the SFT "
                             "cross-entropy of one batch of it to the GRPO loss before clipping (InstructGPT's "
                             "PPO-ptx: a supervised term that holds the policy near what it was fitted to). "
                             "Measured (docs/RESULTS.md, session 27): 16 anchored steps from the shipped adapter "
                             "won 41 / 200, the anchor's SFT steps alone 38, plain GRPO 48 (43 at step 24): all "
                             "within noise of the start's 45.")
    weight: float = Field(1.0, ge=0, description="Multiplier of the anchor's token-mean cross-entropy.")
    batch_size: int = Field(16, ge=1, description="Records per step, drawn in length buckets as `sft` draws them.")
    seed: int = Field(0, ge=0, lt=2 ** 32, description="Order of the anchor batches.")


class ValidationSection(StrictModel):
    every: int = Field(10, ge=0, description="Validate every N steps (and at the end); 0 = never.")
    games: int = Field(20, ge=1, description="The first N valid-split words, all played every time.")
    temperature: float = Field(0.0, ge=0)
    early_stopping_patience: int = Field(0, ge=0, description="Stop after N passes without a better win rate; 0 = off.")


class GRPOConfig(StrictModel):
    model: ModelSection = Field(default_factory=ModelSection)
    lora: LoraSection = Field(default_factory=LoraSection)
    training: TrainingSection = Field(default_factory=TrainingSection)
    rl: RLSection = Field(default_factory=RLSection)
    grpo: GRPOSection = Field(default_factory=GRPOSection)
    reward: RewardWeights = Field(default_factory=RewardWeights)   # per reply by __post_init__, per mode below
    prompts: PromptsSection = Field(default_factory=PromptsSection)
    anchor: AnchorSection = Field(default_factory=AnchorSection)
    validation: ValidationSection = Field(default_factory=ValidationSection)
    logs_dir: str = Field("logs", description="Run folders go here (relative to the config file).")
    run_name: str | None = None
    resume: str | None = Field(None, description="Run folder to continue from its latest checkpoint.")
    overwrite: bool = Field(False, description="Replace an existing run folder of the same name.")
    progress: bool = True

    @model_validator(mode="after")
    def _check_train_layers(self) -> "GRPOConfig":
        if self.lora.train_layers is not None and self.model.adapter is None:
            raise ValueError(f"lora.train_layers = {self.lora.train_layers} needs model.adapter (a fresh LoRA "
                             "covers the last lora.num_layers blocks, set that instead)")
        return self

    @model_validator(mode="after")
    def _check_advantage_for_mode(self) -> "GRPOConfig":
        if self.grpo.advantage == "prefix" and self.rl.mode != "turn":
            raise ValueError(f"grpo.advantage 'prefix' needs rl.mode 'turn' (one reply per sample), "
                             f"got rl.mode {self.rl.mode!r}")
        return self

    @model_validator(mode="after")
    def _check_reward_for_mode(self) -> "GRPOConfig":
        try:
            self.reward.check(self.rl.max_turns, self.rl.mode)
        except ValueError as exc:
            raise ValueError(f"reward (rl.mode {self.rl.mode!r}): {exc}") from None
        return self
