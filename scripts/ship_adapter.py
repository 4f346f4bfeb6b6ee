"""Package a trained LoRA adapter for the repository: adapter files, the configs that made it, its data seed
and its eval JSON, in one folder (written to a temp folder, then renamed into place).

    python3 scripts/ship_adapter.py --adapter logs/grpo-cover-270m/adapters --out adapters/gemma-3-270m-wordle \
        --data-config config/recipe-270m/data.json --sft-config config/recipe-270m/sft.json \
        --sft-config "config/recipe-270m/sft-choice-more.json --seed 1 --run-name sft-choice2-270m" \
        --grpo-config config/recipe-270m/grpo-cover.json --eval logs/recipe-270m/eval_grpocover_greedy.json

An `--sft-config` may carry the `wordle-mlx sft` flags the recipe passed with it (--seed, --run-name,
--adapter, --steps, --save-every): the recipe folder then records the config with them applied, each where the
config keeps it (run.seed, run.name, model.adapter, run.steps, run.save_every).

`--guard NEW_EVAL SHIPPED_EVAL` ships only an adapter at least as good as the one already in `--out`: NEW_EVAL is
the new adapter's greedy eval on the test words, SHIPPED_EVAL the same eval (split, board, games, decoding) of the
adapter in `--out`. The option repeats, one pair per decoding (the recipe guards words and free decoding), and
every pair must hold. When the new one wins fewer games in any, or two evals cannot be compared, the script says why and
leaves `--out` untouched (exit 0: nothing failed, nothing was shipped). `--stage-seconds DIR` records the recipe's
stage markers (DIR/<stage>.done, each holding its seconds) as `stage_seconds.json`.

`data_seed.json` holds the data configs (their seeds regenerate the data exactly) and the secrets of every
training and validation record of each, so a test can check that no test word was ever a secret.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import sys
import tempfile
from pathlib import Path

ADAPTER_FILES = ("adapters.safetensors", "adapter_config.json")
README = """# {out}

LoRA adapter (mlx-lm format) for `builtin:gemma-3-270m`, packaged from `{adapter}` by
`scripts/ship_adapter.py`. `recipe/` holds the configs that trained it, in order; docs/RESULTS.md ("The
shipped adapter") says which run that was and has every number with its command. Its `adapter_config.json`
records the prompt settings it was trained with (`wordle_prompt`) and the decoding it was trained for
(`decode`, `trained_free`), which `eval`, `play` and `train` use for it.

    wordle-mlx play --adapter {out}
    wordle-mlx eval --adapter {out} --games 200 --max-tokens {max_tokens} --no-baselines

- `recipe/`: the data, SFT and GRPO configs of the run, numbered in the order the recipe runs them
  (data 1 and SFT 1: the broad 30-minute SFT; data 2 and SFT 2: the focus SFT that starts from it;
  data 3 and SFT 3: the fit SFT on the teacher's boards weighted by traffic).
  `choice_N.json`, when present: self-play rounds (`wordle-mlx data self-play`), self-play boards labelled
  with the fitting answer the model scored highest. The SFT configs after the third train on them, in order,
  each from the adapter its `model.adapter` names (the stage before it). `grpo.json`, or `grpo_N.json` for
  several GRPO stages in the order they ran. Every SFT and GRPO config names the adapter it starts from
  (`model.adapter`), so the chain reads back from the stage that trained this adapter; run in that order,
  they train it again.
- `data_seed.json`: the data configs (their seeds regenerate the training data) and every train/valid
  secret; `tests/test_shipped_adapter.py` checks that none is a test word.

| eval JSON | split | history | temperature | decoding | wins | win rate (95% CI) | format-valid replies | invalid words |
|---|---|---|---:|---|---:|---:|---:|---:|
{evals}
"""
MAX_BYTES = 20 * 1024 * 1024
ROOT = Path(__file__).resolve().parents[1]


# `wordle-mlx sft` flag -> (the config field it sets, dotted; its type)
SFT_FLAGS = {"--seed": ("run.seed", int), "--run-name": ("run.name", str), "--adapter": ("model.adapter", Path),
             "--steps": ("run.steps", int), "--save-every": ("run.save_every", int)}


def sft_config_with_flags(spec: str) -> tuple[Path, dict]:
    """(config path, its JSON with the `wordle-mlx sft` flags after the path applied): 'FILE [--flag VALUE]...'.
    An --adapter path, relative to the working folder as on the command line, is recorded relative to the
    config's folder as config paths are."""
    path, *flags = shlex.split(spec)
    path = Path(path)
    cfg = json.loads(path.read_text())
    if len(flags) % 2:
        sys.exit(f"error: --sft-config {spec!r}: expected FILE followed by flag/value pairs")
    for flag, value in zip(flags[::2], flags[1::2]):
        if flag not in SFT_FLAGS:
            sys.exit(f"error: --sft-config {spec!r}: unknown flag {flag} (known: {', '.join(SFT_FLAGS)})")
        dotted, kind = SFT_FLAGS[flag]
        section, key = dotted.split(".")
        node = cfg.setdefault(section, {})
        if not isinstance(node, dict):
            sys.exit(f"error: --sft-config {spec!r}: {path}: {section} is {node!r}, not a section; {flag} sets "
                     f"{dotted} (a config of an older shape: the README lists the renamed fields)")
        node[key] = os.path.relpath(Path(value).resolve(), path.parent.resolve()) if kind is Path else kind(value)
    return path, cfg


def data_secrets(data_dir: Path) -> dict[str, list[str]]:
    out = {}
    for split in ("train", "valid"):
        path = data_dir / f"{split}.jsonl"
        if not path.is_file():
            sys.exit(f"error: {path}: missing (run `wordle-mlx data --config ...` first)")
        out[split] = sorted({json.loads(line)["meta"]["secret"] for line in path.read_text().splitlines() if line})
    return out


def round_secrets(cfg: dict) -> dict[str, list[str]]:
    """The secrets a self-play round played, from its config (the stage's own `played_secrets`, with the
    stage's defaults), for a round whose data folder is no longer on this machine."""
    sys.path.insert(0, str(ROOT))
    from wordle_mlx.game.splits import split_answers
    from wordle_mlx.stages.choice import ChoiceConfig, played_secrets
    config = ChoiceConfig(**cfg)
    return {split: sorted(words) for split, words in played_secrets(config, split_answers()).items()}


def eval_decode(e: dict) -> str:
    """An eval JSON's decoding (evals made before decoding modes say `constrain` for words, nothing for free)."""
    return e.get("decode") or ("words" if e.get("constrain") else "free")


def guard_verdict(new_path: Path, shipped_path: Path, out: Path) -> str | None:
    """None when the new adapter may replace the one in `out`, else why not (one line)."""
    if not (out / "adapters.safetensors").is_file():
        return None                                   # nothing shipped yet: nothing to guard
    if not new_path.is_file():
        return f"no eval of the new adapter to compare ({new_path} is missing)"
    if not shipped_path.is_file():
        return f"no eval of the shipped adapter to compare with ({shipped_path} is missing)"
    new, old = json.loads(new_path.read_text()), json.loads(shipped_path.read_text())
    for key, want in (("split", "test"), ("history", "none"), ("temperature", 0.0)):
        for name, e in ((new_path, new), (shipped_path, old)):
            if e.get(key) != want:
                return f"{name}: {key} is {e.get(key)!r}, the guard compares greedy test games ({key} {want!r})"
    if eval_decode(new) != eval_decode(old):
        return (f"{new_path} decodes {eval_decode(new)}, {shipped_path} {eval_decode(old)}: the guard compares "
                "the same decoding")
    secrets = [[g["secret"] for g in e.get("game_records", [])] for e in (new, old)]
    if new["games"] != old["games"] or secrets[0] != secrets[1]:
        return f"{new_path} and {shipped_path} played different games ({new['games']} and {old['games']})"
    if new["wins"] < old["wins"]:
        return (f"the new adapter wins {new['wins']} / {new['games']} greedy test games in {eval_decode(new)} "
                f"decoding, the shipped one {old['wins']}")
    return None


def stage_seconds(folder: Path) -> dict[str, int]:
    """{stage: seconds} from the recipe's markers (<stage>.done holds the stage's seconds)."""
    out = {}
    for path in sorted(folder.glob("*.done")):
        text = path.read_text().strip()
        out[path.stem] = int(text) if text.isdigit() else text
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--adapter", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--data-config", type=Path, action="append", required=True, help="Repeatable, in order.")
    ap.add_argument("--sft-config", action="append", required=True,
                    help="Repeatable, in order: 'FILE [--seed N --run-name NAME ...]' (flags as given to sft).")
    ap.add_argument("--grpo-config", type=Path, action="append", default=[],
                    help="GRPO stages' configs (repeatable, in order).")
    ap.add_argument("--choice-config", type=Path, action="append", default=[],
                    help="Self-play rounds' configs (repeatable, in order); their data folders' secrets are added.")
    ap.add_argument("--eval", type=Path, action="append", default=[], help="Eval JSON files to ship (repeatable).")
    ap.add_argument("--guard", type=Path, nargs=2, action="append", default=[], metavar=("NEW_EVAL", "SHIPPED_EVAL"),
                    help="Ship only if NEW_EVAL wins at least as many games as SHIPPED_EVAL (repeatable: all must hold).")
    ap.add_argument("--stage-seconds", type=Path, help="The recipe's stage marker folder (<stage>.done files).")
    args = ap.parse_args()

    for new_eval, shipped_eval in args.guard:
        why = guard_verdict(new_eval, shipped_eval, args.out)
        if why is not None:
            print(f"not shipped: {why}; {args.out} left as it was", file=sys.stderr)
            return

    for name in ADAPTER_FILES:
        if not (args.adapter / name).is_file():
            sys.exit(f"error: {args.adapter / name}: missing; --adapter must be an mlx-lm adapter folder")
    size = (args.adapter / "adapters.safetensors").stat().st_size
    if size > MAX_BYTES:
        sys.exit(f"error: {args.adapter}/adapters.safetensors: {size} bytes, over the 20 MB limit")
    data_cfgs = [json.loads(path.read_text()) for path in args.data_config]
    sft_cfgs = [sft_config_with_flags(spec)[1] for spec in args.sft_config]
    secrets: dict[str, set[str]] = {"train": set(), "valid": set()}
    choice_cfgs = [json.loads(path.read_text()) for path in args.choice_config]
    for kind, path, cfg in [*(("data", *pc) for pc in zip(args.data_config, data_cfgs)),
                            *(("choice", *pc) for pc in zip(args.choice_config, choice_cfgs))]:
        folder = (path.parent / cfg.get("out", "data/sft")).resolve()
        if kind != "data" and not (folder / "train.jsonl").is_file():
            words_by_split = round_secrets(cfg)
            print(f"note: {folder}: not here; the secrets its round played are taken from {path}'s seed",
                  file=sys.stderr)
        else:
            words_by_split = data_secrets(folder)
        for split, words in words_by_split.items():
            secrets[split].update(words)

    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{args.out.name}.", dir=args.out.parent))
    tmp.chmod(0o755)
    try:
        for name in ADAPTER_FILES:
            shutil.copy2(args.adapter / name, tmp / name)
        recipe = tmp / "recipe"
        recipe.mkdir()
        for i, path in enumerate(args.data_config, start=1):
            shutil.copy2(path, recipe / (f"data_{i}.json" if len(args.data_config) > 1 else "data.json"))
        for i, cfg in enumerate(sft_cfgs, start=1):
            target = recipe / (f"sft_{i}.json" if len(args.sft_config) > 1 else "sft.json")
            target.write_text(json.dumps(cfg, indent=2) + "\n")
        for i, path in enumerate(args.grpo_config, start=1):
            shutil.copy2(path, recipe / (f"grpo_{i}.json" if len(args.grpo_config) > 1 else "grpo.json"))
        for i, path in enumerate(args.choice_config, start=1):
            shutil.copy2(path, recipe / f"choice_{i}.json")
        seed = {"data_configs": data_cfgs, "choice_configs": choice_cfgs,
                "secrets": {k: sorted(v) for k, v in secrets.items()},
                "note": "GRPO draws its secrets from the train split (wordle_mlx/game/splits.py) with its own seed."}
        (tmp / "data_seed.json").write_text(json.dumps(seed, indent=1) + "\n")
        if args.stage_seconds:
            (tmp / "stage_seconds.json").write_text(json.dumps(stage_seconds(args.stage_seconds), indent=1) + "\n")
        lines, max_tokens = [], 16
        for path in args.eval:
            shutil.copy2(path, tmp / path.name)
            e = json.loads(path.read_text())
            lo, hi = e["win_rate_ci95"]
            max_tokens = e.get("max_tokens_per_turn", max_tokens)
            lines.append(f"| `{path.name}` | {e['split']} | {e['history']} | {e['temperature']} "
                         f"| {eval_decode(e)} | {e['wins']} / {e['games']} "
                         f"| {100 * e['win_rate']:.1f}% ({100 * lo:.1f}-{100 * hi:.1f}) "
                         f"| {100 * (1 - e['format_error_rate']):.1f}% | {100 * e['invalid_rate']:.1f}% |")
        (tmp / "README.md").write_text(README.format(adapter=args.adapter, out=args.out, evals="\n".join(lines),
                                                     max_tokens=max_tokens))
        old = args.out.with_name(f".{args.out.name}.old")
        if args.out.exists():
            shutil.rmtree(old, ignore_errors=True)
            args.out.rename(old)
        tmp.rename(args.out)
        shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    print(f"shipped {args.adapter} -> {args.out} ({size / 1e6:.1f} MB adapter)")


if __name__ == "__main__":
    main()
