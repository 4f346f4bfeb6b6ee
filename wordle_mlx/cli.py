"""The `wordle-mlx` command line: thin Typer commands that parse arguments and hand off.

Each command builds its stage's config (from a JSON file and/or flags) through `config.load_config`,
calls the stage's `run(cfg)`, and prints JSON on stdout when asked. A `UserError` anywhere becomes one
line on stderr and exit code 2; there is no traceback for bad input. On Linux the process first
re-executes itself with OpenBLAS preloaded (see `runtime/blas.py`).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from .runtime.blas import reexec_for_linux_cpu
from .config import load_config
from .errors import UserError
from .runtime.stop_signals import EXIT_CODES


class _Commands(typer.core.TyperGroup):
    """Turns a UserError from any command into one line on stderr and exit code 2, and keeps the command line's
    words (`ctx.meta["argv"]`) for options that take several values (`plot --compare A B`)."""

    def parse_args(self, ctx, args):
        ctx.meta.setdefault("argv", list(args))
        return super().parse_args(ctx, args)

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except UserError as err:
            print(f"error: {err}", file=sys.stderr)
            raise typer.Exit(code=err.exit_code) from None


app = typer.Typer(cls=_Commands, add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Teach a Gemma 3 model to play Wordle with SFT and GRPO on MLX.")

JsonFlag = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON on stdout.")]
ConfigOpt = Annotated[Optional[Path], typer.Option("--config", "-c", help="JSON config file.")]
PrintConfig = Annotated[bool, typer.Option("--print-config", help="Print the effective config (defaults, file and flags merged) as JSON and exit.")]


def emit(result: dict, as_json: bool) -> None:
    if as_json:
        print(json.dumps(result, indent=2))


def run_stage(stage, cfg, print_config: bool, json_output: bool) -> dict | None:
    """`--print-config`: the effective config (defaults, file and flags merged) as JSON, and nothing run; else the
    stage's run, its result printed with --json."""
    if print_config:
        print(json.dumps(cfg.model_dump(mode="json"), indent=2))
        return None
    result = stage.run(cfg)
    emit(result, json_output)
    return result


def exit_if_stopped(result: dict) -> None:
    """A run ended by Ctrl-C or SIGTERM exits 130 or 143 after its checkpoint, so a script never counts it done."""
    if result.get("signal"):
        step, run_dir = result["step"], result["run"]
        print(f"{result['stopped']} at step {step}: checkpoint saved; continue with --resume {run_dir}",
              file=sys.stderr)
        raise typer.Exit(EXIT_CODES[result["signal"]])


@app.command()
def doctor(json_output: JsonFlag = False,
           size: Annotated[int, typer.Option(help="Matmul size N for the N x N GFLOP/s test.")] = 1024) -> None:
    """Platform, versions, device, BLAS, and MLX vs numpy matmul GFLOP/s."""
    from .stages import doctor as stage
    cfg = load_config(None, stage.DoctorConfig, {"size": size, "json_output": json_output})
    emit(stage.run(cfg), json_output)


@app.command()
def entropy(json_output: JsonFlag = False,
            candidates: Annotated[str, typer.Option(help="Candidate set: 'answers' (2,315) or 'allowed' (all).")] = "answers",
            top: Annotated[int, typer.Option(help="How many guesses to list.")] = 10,
            answers_list: Annotated[str, typer.Option(help="'answers' or a word-list file.")] = "answers",
            allowed_list: Annotated[str, typer.Option(help="'allowed', 'nyt' or a word-list file.")] = "allowed") -> None:
    """Entropy of every allowed guess over the candidates (cached pattern matrix)."""
    from .stages import entropy as stage
    cfg = load_config(None, stage.EntropyConfig, {"candidates": candidates, "top": top, "json_output": json_output,
                                                   "answers_list": answers_list, "allowed_list": allowed_list})
    emit(stage.run(cfg), json_output)


@app.command()
def solve(word: Annotated[Optional[str], typer.Option("--word", help="Play one game against this secret.")] = None,
          all_answers: Annotated[bool, typer.Option("--all", help="Play every answer.")] = False,
          json_output: JsonFlag = False,
          answers_list: Annotated[str, typer.Option(help="'answers' or a word-list file.")] = "answers",
          allowed_list: Annotated[str, typer.Option(help="'allowed', 'nyt' or a word-list file.")] = "allowed") -> None:
    """The greedy max-entropy solver: one game (--word) or all answers (--all)."""
    from .stages import solve as stage
    cfg = load_config(None, stage.SolveConfig, {"word": word, "all_answers": all_answers, "json_output": json_output,
                                                 "answers_list": answers_list, "allowed_list": allowed_list})
    emit(stage.run(cfg), json_output)


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def plot(ctx: typer.Context,
         file: Annotated[Optional[Path], typer.Option("--file", "-f", help="A run's metrics.jsonl: its training charts.")] = None,
         compare: Annotated[Optional[list[str]], typer.Option("--compare", help="Eval JSON files to compare: --compare A B C (several values, or repeat the option).")] = None,
         labels: Annotated[Optional[list[str]], typer.Option("--labels", help="Series names for --compare, in its order: --labels a b c (default: the file names).")] = None,
         out: Annotated[Optional[Path], typer.Option(help="Output folder (default: plots/ beside the input).")] = None,
         window: Annotated[int, typer.Option(help="Games in the rolling win-rate window.")] = 50,
         with_baselines: Annotated[bool, typer.Option("--with-baselines", help="Add eval JSON baselines as series.")] = False,
         json_output: JsonFlag = False) -> None:
    """PNG charts of a run (--file), or compare eval JSONs (--compare A B ... [--labels L1 L2 ...])."""
    from .stages import plot as stage
    lists = stage.list_option_values(ctx.meta.get("argv", []), ctx.args)
    cfg = load_config(None, stage.PlotConfig, {
        "file": str(file) if file else None, "compare": lists["--compare"] or compare or None,
        "labels": lists["--labels"] or labels or None,
        "out": str(out) if out else None, "window": window, "with_baselines": with_baselines, "json_output": json_output})
    emit(stage.run(cfg), json_output)


ModelOpt = Annotated[str, typer.Option("--model", help="Model spec: builtin:gemma-3-270m, builtin:tiny-random, HF id or folder.")]
AdapterOpt = Annotated[Optional[str], typer.Option("--adapter", help="LoRA adapter folder to load (its recorded prompt and reply format apply) (default: none, the base model).")]
DecodeOpt = Annotated[Optional[str], typer.Option("--decode", help="free, grammar or words (default: the decoding the adapter records it was trained for, else grammar): with grammar the reply's tags are forced and only its 5 letters are decoded; words also limits them to spell allowed guesses. Formats with free text are decoded free.")]
DtypeOpt = Annotated[Optional[str], typer.Option("--dtype", help="float32, bfloat16 or float16 (default: the model's; float32 on CPU; WORDLE_MLX_DEFAULT_DTYPE overrides).")]
MaxTokensOpt = Annotated[Optional[int], typer.Option("--max-tokens", help="Max tokens per reply (default: what the reply format needs: 16 without a think block, 256 with one).")]


@app.command(name="eval")
def eval_command(config: ConfigOpt = None,
                 model: Annotated[Optional[str], typer.Option("--model", help="Model spec (default: builtin:gemma-3-270m).")] = None,
                 adapter: AdapterOpt = None,
                 games: Annotated[Optional[int], typer.Option("--games", help="Play the first N words of the split (default: 200).")] = None,
                 split: Annotated[Optional[str], typer.Option("--split", help="test, valid or train (default: test).")] = None,
                 history: Annotated[Optional[str], typer.Option("--history", help="none (empty boards) or seeded (boards with earlier guesses) (default: none).")] = None,
                 temperature: Annotated[Optional[float], typer.Option("--temperature", help="Sampling temperature; 0 = greedy (default: 0).")] = None,
                 seed: Annotated[Optional[int], typer.Option("--seed", help="Sampling and seeded-board seed (default: 0).")] = None,
                 max_tokens: MaxTokensOpt = None,
                 out: Annotated[Optional[Path], typer.Option("--out", help="Write the eval JSON here (default: print only).")] = None,
                 no_baselines: Annotated[bool, typer.Option("--no-baselines", help="Skip solver/base-model baselines.")] = False,
                 decode: DecodeOpt = None, dtype: DtypeOpt = None,
                 timeout: Annotated[Optional[float], typer.Option("--timeout", help="Seconds for the whole eval (default: no limit).")] = None,
                 no_progress: Annotated[bool, typer.Option("--no-progress", help="No progress bars.")] = False,
                 print_config: PrintConfig = False, json_output: JsonFlag = False) -> None:
    """Play held-out words with a model; win rate, errors and throughput vs the solver (and base model)."""
    from .stages import evaluate as stage
    cfg = load_config(config, stage.EvalConfig, {
        # paths typed on the command line are relative to the working folder, not to --config's folder
        "model": model, "adapter": str(Path(adapter).resolve()) if adapter else None, "games": games,
        "split": split, "history": history, "seed": seed,
        "rollout.temperature": temperature, "rollout.max_tokens_per_turn": max_tokens,
        "rollout.decode": decode, "dtype": dtype,
        "out": str(out.resolve()) if out else None, "baselines": False if no_baselines else None,
        "timeout": timeout, "progress": False if no_progress else None, "json_output": json_output})
    run_stage(stage, cfg, print_config, json_output)


@app.command()
def play(model: ModelOpt = "builtin:gemma-3-270m", adapter: AdapterOpt = None,
         secret: Annotated[Optional[str], typer.Option("--secret", help="The secret word (default: a test word picked by --seed).")] = None,
         seed: Annotated[int, typer.Option("--seed", help="Picks the test word when --secret is not given.")] = 0,
         human: Annotated[bool, typer.Option("--human", help="You play; type ? for model and solver hints.")] = False,
         temperature: Annotated[float, typer.Option("--temperature", help="Sampling temperature; 0 = greedy.")] = 0.0,
         max_tokens: MaxTokensOpt = None,
         decode: DecodeOpt = None, dtype: DtypeOpt = None,
         json_output: JsonFlag = False) -> None:
    """Watch a model play one game (reasoning and tiles), or play yourself with --human."""
    from .stages import play as stage
    cfg = load_config(None, stage.PlayConfig, {
        "model": model, "adapter": adapter, "secret": secret, "seed": seed, "human": human,
        "rollout.temperature": temperature, "rollout.max_tokens_per_turn": max_tokens,
        "rollout.decode": decode, "dtype": dtype})
    emit(stage.run(cfg), json_output)


ResumeOpt = Annotated[Optional[Path], typer.Option("--resume", help="Continue logs/<run> from its latest checkpoint (uses its config.json unless --config is given).")]
RunName = Annotated[Optional[str], typer.Option("--run-name", help="Run folder name under run.logs_dir (overrides run.name).")]
Steps = Annotated[Optional[int], typer.Option("--steps", help="Total steps (overrides run.steps).")]
SeedOpt = Annotated[Optional[int], typer.Option("--seed", help="Run seed: data order or prompts, LoRA init, dropout, sampling (overrides run.seed).")]
SaveEvery = Annotated[Optional[int], typer.Option("--save-every", help="Checkpoint every N steps (overrides run.save_every).")]
Overwrite = Annotated[bool, typer.Option("--overwrite", help="Replace an existing run folder of the same name.")]
StartAdapter = Annotated[Optional[Path], typer.Option("--adapter", help="Start from this adapter folder (overrides model.adapter).")]
TrainModel = Annotated[Optional[str], typer.Option("--model", help="Base model spec (overrides model.name).")]
TrainDecodeOpt = Annotated[Optional[str], typer.Option("--decode", help="free, grammar or words (overrides decode): the decoding policy the run trains.")]
ReportTo = Annotated[Optional[str], typer.Option("--report-to", help="Also send the metrics to tensorboard and/or wandb, comma-separated (overrides run.report_to).")]
NoProgress = Annotated[bool, typer.Option("--no-progress", help="No progress bar.")]


def training_config(model_cls, config, resume, run_name, steps, seed, save_every, overwrite, adapter, model, dtype,
                    decode, max_tokens, report_to, no_progress):
    """The config of `sft` or `train`: --config (or the resumed run's config.json), then the flags on top."""
    source = config if config is not None or resume is None else resume / "config.json"
    return load_config(source, model_cls, {
        "run.name": run_name, "run.steps": steps, "run.seed": seed, "run.save_every": save_every,
        "run.resume": str(resume) if resume else None, "run.overwrite": overwrite or None,
        "run.report_to": report_to, "run.progress": False if no_progress else None,
        "model.adapter": str(adapter.resolve()) if adapter else None, "model.name": model, "model.dtype": dtype,
        "decode": decode, "max_tokens": max_tokens})


def run_training(stage, cfg, print_config: bool, json_output: bool) -> None:
    result = run_stage(stage, cfg, print_config, json_output)
    if result is not None:
        exit_if_stopped(result)


@app.command()
def train(config: ConfigOpt = None, resume: ResumeOpt = None, steps: Steps = None, run_name: RunName = None,
          seed: SeedOpt = None, save_every: SaveEvery = None, adapter: StartAdapter = None, model: TrainModel = None,
          dtype: DtypeOpt = None, decode: TrainDecodeOpt = None, max_tokens: MaxTokensOpt = None,
          report_to: ReportTo = None, overwrite: Overwrite = False, no_progress: NoProgress = False,
          print_config: PrintConfig = False, json_output: JsonFlag = False) -> None:
    """GRPO: play games every step and update a LoRA adapter (metrics, checkpoints, adapters in logs/<run>).

    With no --config, the defaults are the 270M recipe's GRPO stage, starting from logs/sft/adapters (what
    `wordle-mlx sft` writes with no config)."""
    from .stages import grpo as stage
    cfg = training_config(stage.GRPOConfig, config, resume, run_name, steps, seed, save_every, overwrite, adapter,
                          model, dtype, decode, max_tokens, report_to, no_progress)
    run_training(stage, cfg, print_config, json_output)


data_app = typer.Typer(cls=_Commands, help="Make SFT data: solver data (no subcommand), self-play or answer coverage.")
app.add_typer(data_app, name="data")
Out = Annotated[Optional[Path], typer.Option("--out", help="Output folder (overrides the config's out).")]


@data_app.callback(invoke_without_command=True)
def data_command(ctx: typer.Context, config: ConfigOpt = None, out: Out = None,
                 seed: Annotated[Optional[int], typer.Option("--seed", help="Data seed (overrides seed) (default: 0).")] = None,
                 train_examples: Annotated[Optional[int], typer.Option("--train-examples", help="Seeded train examples (default: 10000).")] = None,
                 valid_examples: Annotated[Optional[int], typer.Option("--valid-examples", help="Seeded valid examples (default: 300).")] = None,
                 tokenizer: Annotated[Optional[str], typer.Option("--tokenizer", help="Model spec whose tokenizer counts target tokens (default: characters / 4).")] = None,
                 no_progress: NoProgress = False, print_config: PrintConfig = False, json_output: JsonFlag = False) -> None:
    """Synthetic SFT data (no subcommand): history-seeded boards, the solver as teacher, replay-checked; writes
    data/sft by default. Subcommands make data from a trained adapter's own play (their options go after them)."""
    if ctx.invoked_subcommand is not None:      # `data`'s own options would be ignored by a subcommand: refused
        given = {"--config": config, "--out": out, "--seed": seed, "--train-examples": train_examples,
                 "--valid-examples": valid_examples, "--tokenizer": tokenizer, "--no-progress": no_progress or None,
                 "--json": json_output or None, "--print-config": print_config or None}
        flag = next((f for f, value in given.items() if value is not None), None)
        if flag is not None:
            sub = ctx.invoked_subcommand
            own = {o for param in ctx.command.get_command(ctx, sub).params for o in param.opts}
            raise UserError(f"data {flag}: an option of `data` alone, not of `data {sub}`; "
                            + (f"put it after the subcommand: data {sub} {flag} ..." if flag in own
                               else f"`data {sub}` has no {flag} (see data {sub} --help)"))
        return
    from .stages import data as stage
    cfg = load_config(config, stage.DataConfig, {
        "out": str(out.resolve()) if out else None, "seed": seed, "train_examples": train_examples,
        "valid_examples": valid_examples, "tokenizer": tokenizer, "progress": False if no_progress else None})
    run_stage(stage, cfg, print_config, json_output)


@data_app.command(name="self-play")
def self_play(config: ConfigOpt = None,
              adapter: Annotated[Optional[Path], typer.Option("--adapter", help="LoRA adapter whose choices label the boards (overrides adapter).")] = None,
              out: Out = None,
              train_games: Annotated[Optional[int], typer.Option("--train-games", help="Train secrets played (default: all).")] = None,
              no_progress: NoProgress = False, print_config: PrintConfig = False, json_output: JsonFlag = False) -> None:
    """SFT data from self-play where each board's label is the fitting answer the model scores highest
    (writes data/self-play by default)."""
    from .stages import choice as stage
    cfg = load_config(config, stage.ChoiceConfig, {
        "adapter": str(adapter.resolve()) if adapter else None, "out": str(out.resolve()) if out else None,
        "train_games": train_games, "progress": False if no_progress else None})
    run_stage(stage, cfg, print_config, json_output)


@data_app.command(name="cover")
def cover(config: ConfigOpt = None,
          data: Annotated[Optional[Path], typer.Option("--data", help="Input SFT data folder (overrides data) (default: data/self-play).")] = None,
          out: Annotated[Optional[Path], typer.Option("--out", help="Output folder (overrides out) (default: data/cover).")] = None,
          max_candidates: Annotated[Optional[int], typer.Option("--max-candidates", help="Only boards where at most this many answers fit (default: 5).")] = None,
          copies: Annotated[Optional[int], typer.Option("--copies", help="Times each coverage example appears (default: 4).")] = None,
          no_progress: NoProgress = False, print_config: PrintConfig = False, json_output: JsonFlag = False) -> None:
    """Add answer-coverage examples to an SFT data folder: every answer as a fitting guess on train boards."""
    from .stages import cover as stage
    cfg = load_config(config, stage.CoverConfig, {
        "data": str(data.resolve()) if data else None, "out": str(out.resolve()) if out else None,
        "max_candidates": max_candidates, "copies": copies,
        "progress": False if no_progress else None})
    run_stage(stage, cfg, print_config, json_output)


@app.command()
def sft(config: ConfigOpt = None, resume: ResumeOpt = None, steps: Steps = None, run_name: RunName = None,
        seed: SeedOpt = None, save_every: SaveEvery = None, adapter: StartAdapter = None, model: TrainModel = None,
        dtype: DtypeOpt = None, decode: TrainDecodeOpt = None, max_tokens: MaxTokensOpt = None,
        report_to: ReportTo = None, overwrite: Overwrite = False, no_progress: NoProgress = False,
        print_config: PrintConfig = False, json_output: JsonFlag = False) -> None:
    """LoRA supervised fine-tuning on `wordle-mlx data` output (data/sft by default); run folder logs/<run>."""
    from .stages import sft as stage
    cfg = training_config(stage.SFTConfig, config, resume, run_name, steps, seed, save_every, overwrite, adapter,
                          model, dtype, decode, max_tokens, report_to, no_progress)
    run_training(stage, cfg, print_config, json_output)


def fuse_config(adapter, out, model, dtype, dequantize, overwrite, json_output=False):
    """The FuseConfig of `fuse`'s flags (also what `plan fuse ...` plans)."""
    from .stages.fuse_config import FuseConfig
    return load_config(None, FuseConfig, {"model": model, "adapter": str(adapter), "out": str(out), "dtype": dtype,
                                          "dequantize": dequantize, "overwrite": overwrite})


def export_config(adapter, out, model, dtype, overwrite, ollama, json_output):
    """The ExportConfig of `export`'s flags (also what `plan export ...` plans)."""
    from .stages.export_config import ExportConfig
    return load_config(None, ExportConfig, {"adapter": str(adapter), "out": str(out), "model": model, "dtype": dtype,
                                            "overwrite": overwrite, "ollama": ollama, "json_output": json_output})


@app.command()
def fuse(adapter: Annotated[Path, typer.Option("--adapter", help="LoRA adapter folder (adapters.safetensors + adapter_config.json).")],
         out: Annotated[Path, typer.Option("--out", help="Folder for the fused model.")],
         model: Annotated[str, typer.Option("--model", help="Base model spec.")] = "builtin:gemma-3-270m",
         dtype: Annotated[Optional[str], typer.Option("--dtype", help="float32, bfloat16 or float16 (default: float32 on CPU).")] = None,
         dequantize: Annotated[bool, typer.Option("--dequantize", help="Quantized base: write the fused model "
                                                  "dequantized (base float dtype, or --dtype) instead of re-quantized "
                                                  "(the default, as mlx-lm; lossy).")] = False,
         overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace an existing output folder.")] = False,
         json_output: JsonFlag = False) -> None:
    """Merge a LoRA adapter into the base weights; verified against the adapter model before it is kept.

    The output is a text-only mlx-lm folder: a multimodal base's vision part (vision tower, projector,
    vision_config) is dropped. The check's limit comes from the dtype and the quantization (llm/model/fuse_bounds.py)."""
    from .stages import fuse as stage
    result = stage.run(fuse_config(adapter, out, model, dtype, dequantize, overwrite))
    if not json_output:
        from .runtime.progress import console
        console.print(f"fused {result['fused_layers']} layers into {result['out']} ({result['output']} "
                      f"{result['dtype']}; max logit diff {result['max_abs_logit_diff']:.2e} <= "
                      f"{result['tolerance']:.2e}, the adapter's own effect {result['adapter_effect']:.2e}); "
                      f"{result['vision']}")
    emit(result, json_output)


STAGE_COMMANDS = {"fuse": fuse_config, "export": export_config}


def stage_command(ctx: typer.Context, words: list[str]) -> tuple[str, object]:
    """(kind, config) of a `fuse ...` or `export ...` command line, parsed by that command's own options."""
    if not words or words[0] not in STAGE_COMMANDS:
        raise UserError(f"plan: {' '.join(words)!r}: give --config FILE, or a fuse or export command "
                        "(`wordle-mlx plan fuse --adapter A --out D ...`)")
    group = ctx.parent
    command = group.command.get_command(group, words[0])
    with command.make_context(words[0], list(words[1:]), parent=group) as sub:
        return words[0], STAGE_COMMANDS[words[0]](**sub.params)


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def plan(ctx: typer.Context,
         config: Annotated[Optional[Path], typer.Option("--config", "-c", help="An SFT, GRPO, eval, self-play, fuse or export config file.")] = None,
         model_config: Annotated[Optional[Path], typer.Option("--model-config", help="The model's config.json (or its folder), instead of finding it from the config's model.")] = None,
         memory_gb: Annotated[Optional[float], typer.Option("--memory-gb", help="Find the largest batch for this much memory (default: this machine's).")] = None,
         prompt_tokens: Annotated[Optional[int], typer.Option("--prompt-tokens", help="Prompt length in tokens (default: estimated from the prompt style).")] = None,
         measure: Annotated[bool, typer.Option("--measure", help="Also run two real steps of the stage here: MLX's measured peak and the whole stage's projected time.")] = False,
         json_output: JsonFlag = False) -> None:
    """Expected peak memory of an SFT, GRPO, eval, self-play, fuse or export config, itemised, the Macs it fits and
    the largest batch that fits. A fuse or export command is planned as given: `wordle-mlx plan fuse --adapter A
    --out D --model M --dequantize` (plan's own options go before it)."""
    from .stages import plan, plan_measure
    stage = None
    if ctx.args or config is None:
        if config is not None:
            raise UserError("plan: give --config FILE or a fuse / export command, not both")
        if measure:
            raise UserError("plan --measure: runs SFT, GRPO, eval or self-play steps; run the fuse or export itself")
        stage = stage_command(ctx, ctx.args)
    cfg = load_config(None, plan.PlanConfig, {"config": str(config) if config else "wordle-mlx " + " ".join(ctx.args),
                                              "model_json": str(model_config) if model_config else None,
                                              "memory_gb": memory_gb, "prompt_tokens": prompt_tokens,
                                              "measure": measure, "json_output": json_output})
    if cfg.measure and plan.stage_config(cfg.config)[0] in STAGE_COMMANDS:
        raise UserError("plan --measure: runs SFT, GRPO, eval or self-play steps; run the fuse or export itself")
    emit((plan_measure if cfg.measure else plan).run(cfg) if stage is None else plan.run(cfg, stage), json_output)


@app.command()
def export(adapter: Annotated[Path, typer.Option("--adapter", help="LoRA adapter folder (adapters.safetensors + adapter_config.json).")],
           out: Annotated[Path, typer.Option("--out", help="GGUF file to write; beside it NAME.gbnf (the reply grammar for llama.cpp), NAME.llamacpp.md (usage) and NAME.Modelfile (Ollama).")],
           model: Annotated[Optional[str], typer.Option("--model", help="Base model spec (default: the adapter's base_model).")] = None,
           dtype: Annotated[str, typer.Option("--dtype", help="Matrix storage: float32, float16 or q8 (GGUF's f32, f16, q8_0; norms stay float32).")] = "float32",
           overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace existing output files (and remove an earlier export's grammar or Modelfile this one does not write).")] = False,
           ollama: Annotated[Optional[bool], typer.Option("--ollama/--no-ollama", help="Require / leave out the Ollama Modelfile (default: written when the adapter can play free decoding, which Ollama plays; --ollama refuses an adapter whose reply tags were never trained).", show_default=False)] = None,
           json_output: JsonFlag = False) -> None:
    """Write the player (base model + fused LoRA, text weights) as a GGUF for llama.cpp / Ollama, with its reply grammar."""
    from .stages import export as stage
    emit(stage.run(export_config(adapter, out, model, dtype, overwrite, ollama, json_output)), json_output)


@app.command()
def grammar(board: Annotated[str, typer.Option("--board", help="The guesses so far, comma-separated, each optionally with its tiles: crane,sloth or crane:XYXXG,sloth:XXGXX.")] = "",
            model: Annotated[str, typer.Option("--model", help="The model whose tokenizer spells the reply (only its tokenizer files are read).")] = "builtin:gemma-3-270m",
            decode: Annotated[str, typer.Option("--decode", help="words (the allowed guesses minus the board's) or grammar (any 5 letters).")] = "words",
            out: Annotated[Optional[Path], typer.Option("--out", help="Write the grammar here (default: stdout).")] = None,
            json_output: JsonFlag = False) -> None:
    """The GBNF grammar of one board's reply for llama.cpp: in words decoding, the allowed guesses minus the board's."""
    from .stages import grammar as stage
    cfg = load_config(None, stage.GrammarConfig, {"board": board, "model": model, "decode": decode,
                                                   "out": str(out) if out else None, "json_output": json_output})
    emit(stage.run(cfg), json_output)


@app.command(name="recipe")
def recipe_command(recipe: Annotated[Optional[Path], typer.Argument(help="The recipe file (default: config/recipe.json).")] = None,
                   model: Annotated[Optional[str], typer.Option("--model", help="The model to train; its dtype, blocks trained, checkpointing and fuse derive from it (default: builtin:gemma-3-270m).")] = None,
                   dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the stages still to run, their commands, planned peaks and projected times; run nothing.")] = False,
                   until: Annotated[Optional[str], typer.Option("--until", help="Stop after this stage (run again to go on).")] = None,
                   games: Annotated[Optional[int], typer.Option("--games", help="Games of every eval (default: 200).")] = None,
                   dtype: Annotated[Optional[str], typer.Option("--dtype", help="float32, bfloat16 or float16 (default: this machine's: float32 on CPU, bfloat16 on a GPU); --dtype bfloat16 --dry-run plans what a Mac runs.")] = None,
                   memory_gb: Annotated[Optional[float], typer.Option("--memory-gb", help="Plan for this much memory, as a Mac's working set (default: this machine's).")] = None,
                   no_progress: Annotated[bool, typer.Option("--no-progress", help="No progress bars in the stages.")] = False,
                   json_output: JsonFlag = False) -> None:
    """Run a recipe's stages in order (data, SFT, self-play, cover, GRPO, evals, plots, ship), resumably: a finished
    stage is skipped, an interrupted training stage resumes from its checkpoint."""
    from .stages import recipe as stage
    cfg = load_config(None, stage.RecipeConfig, {
        "recipe": str(recipe) if recipe else None, "model": model, "dry_run": dry_run or None, "until": until,
        "games": games, "dtype": dtype, "memory_gb": memory_gb, "progress": False if no_progress else None})
    result = stage.run(cfg)
    emit(result, json_output)
    if result.get("status"):
        raise typer.Exit(result["status"])


model_app = typer.Typer(cls=_Commands, no_args_is_help=True, help="Import models into mlx-lm folders.")
app.add_typer(model_app, name="model")


@model_app.command(name="import")
def model_import(source: Annotated[str, typer.Argument(help="A Gemma 3 .gguf file, builtin:gemma-3-270m or builtin:tiny-random.")],
                 out: Annotated[Optional[Path], typer.Option("--out", help="New folder for the mlx-lm model (default: the user cache, where --model SOURCE looks).")] = None,
                 dtype: Annotated[Optional[str], typer.Option("--dtype", help="float32, bfloat16, float16, q8 or q4 (linear layers 8- or 4-bit, needs --out) (default: float32 on CPU, bfloat16 with a GPU, or WORDLE_MLX_DEFAULT_DTYPE).")] = None,
                 json_output: JsonFlag = False) -> None:
    """Convert a GGUF (or a builtin model) into a folder that mlx_lm.load and --model accept."""
    from .stages import model_import as stage
    cfg = load_config(None, stage.ModelImportConfig, {"source": source, "out": str(out) if out else None, "dtype": dtype,
                                                       "json_output": json_output})
    emit(stage.run(cfg), json_output)


def main() -> None:
    reexec_for_linux_cpu()
    try:
        app()
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(err.exit_code)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)
