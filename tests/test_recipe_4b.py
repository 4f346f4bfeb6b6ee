"""The Gemma 3 4B recipe: `wordle-mlx recipe --model mlx-community/gemma-3-4b-it-bf16` (or -4bit; `make train-4b
VARIANT=...`) builds every stage from config/recipe.json and the model. Each stage reads what an earlier one
writes, both variants differ only in the model, each config is the 270M one's at 4B scale (the model, its paths
and run names, gradient checkpointing where the planner says so, 12 of 34 blocks where the 270M trains 6 of 18),
and the memory planner says each training config fits its Mac (4-bit: 16 GB, bf16: 24 GB) with the real 4B
dimensions."""

from __future__ import annotations

import json
import tempfile
import unittest
from pathlib import Path

from tests.rehearsal.recipe import MAC_GB, RECIPE, chain_4b
from tests.test_recipe_runner import flat, working_folder
from wordle_mlx.stages import plan
from wordle_mlx.stages.recipe import build_stages
from wordle_mlx.stages.recipe_build import PATH_FIELDS, write_snapshot

ROOT = Path(__file__).resolve().parent.parent
# mlx-community/gemma-3-4b-it-bf16's config.json, the keys that size the model
CONFIG_4B = {"model_type": "gemma3", "vocab_size": 262_208, "torch_dtype": "bfloat16", "eos_token_id": [1, 106],
             "text_config": {"model_type": "gemma3_text", "hidden_size": 2560, "intermediate_size": 10240,
                             "num_hidden_layers": 34, "num_attention_heads": 8, "num_key_value_heads": 4,
                             "head_dim": 256, "sliding_window": 1024, "sliding_window_pattern": 6}}
STAGES_4B = ["entropy", "data", "sft", "data-focus", "sft-focus", "data-fit", "sft-fit", "choice", "sft-choice",
             "sft-choice2", "sft-choice3", "sft-choice4", "choice2", "cover", "sft-cover", "grpo-cover", "choice3",
             "cover2", "sft-cover2", "choice4", "cover3", "sft-cover3", "eval-sft1-greedy", "eval-sftcover-greedy",
             "eval-grpocover-greedy", "eval-sftcover3-greedy", "fuse", "eval-fused-greedy"]


def adapters_of(stage) -> str:
    return str(stage.run_dir / "adapters")


def reads(stage) -> tuple[list[str], list[str]]:
    """(adapters, data folders) a stage reads, as paths relative to the working folder."""
    cfg, kind = stage.config, stage.kind
    if kind in ("sft", "grpo"):
        return [cfg.model.adapter] if cfg.model.adapter else [], [cfg.data.folder] if kind == "sft" else []
    if kind in ("self-play", "eval", "fuse"):
        return [cfg.adapter] if cfg.adapter else [], []
    if kind == "cover":
        return [], [cfg.data]
    return [], []


class Recipe4BTest(unittest.TestCase):
    def test_every_stage_in_order_each_reading_what_an_earlier_one_writes(self):
        for variant in MAC_GB:
            with self.subTest(variant=variant):
                stages = chain_4b(variant)
                self.assertEqual(list(stages), STAGES_4B)
                trained, made = set(), set()
                for name, stage in stages.items():
                    adapters, folders = reads(stage) if stage.config is not None else ([], [])
                    for adapter in adapters:
                        self.assertIn(adapter, trained, f"{name} reads {adapter} before a stage trains it")
                    for folder in folders:
                        self.assertIn(folder, made, f"{name} reads {folder} before a stage writes it")
                    if stage.kind in ("sft", "grpo"):
                        trained.add(adapters_of(stage))
                    if stage.kind in ("data", "self-play", "cover"):
                        made.add(str(stage.out))
                self.assertEqual(stages["sft"].config.data.folder, f"data/4b-{variant}/sft")
                self.assertEqual(stages["sft-cover"].config.data.folder, f"data/4b-{variant}/choice2-cover5c4")
                self.assertEqual(stages["fuse"].config.adapter, adapters_of(stages["sft-cover3"]))
                self.assertEqual(stages["fuse"].config.dequantize, variant == "4bit")   # the fuse that passes
                self.assertEqual("--dequantize" in stages["fuse"].commands[0], variant == "4bit")
                fused = stages["eval-fused-greedy"].config
                self.assertEqual((fused.model, fused.adapter), (str(stages["fuse"].out), None))

    def test_the_recipe_is_the_270m_recipe_at_4b_scale(self):
        """Each 4B stage config is its 270M twin but for the model and dtype, its paths and run names, gradient
        checkpointing (the planner's) and train_layers 12 of 34 blocks where the 270M trains 6 of 18."""
        with tempfile.TemporaryDirectory() as tmp, working_folder(Path(tmp)):
            _, small = build_stages(str(RECIPE), ship_exists=False)
        small = {s.name: s for s in small}
        for name, big in chain_4b("bf16").items():
            if big.config is None or big.kind in ("fuse", "entropy") or name == "eval-fused-greedy":
                continue
            with self.subTest(stage=name):
                a, b = (flat(s.config.model_dump(mode="json")) for s in (small[name], big))
                skip = {*PATH_FIELDS.get(big.kind, ()), "model", "model.name", "model.dtype", "model.grad_checkpoint",
                        "dtype", "run.name"}
                if big.kind == "sft" and name != "sft":
                    self.assertEqual((a["lora.train_layers"], b["lora.train_layers"]), (6, 12))
                    skip.add("lora.train_layers")
                self.assertEqual({k: v for k, v in b.items() if k not in skip},
                                 {k: v for k, v in a.items() if k not in skip})
                if big.kind in ("sft", "grpo"):
                    self.assertEqual((b["model.name"], b["model.dtype"]),
                                     ("mlx-community/gemma-3-4b-it-bf16", "bfloat16"))

    def test_variants_differ_only_in_the_model(self):
        with tempfile.TemporaryDirectory() as tmp, working_folder(Path(tmp)):
            for name, stage in chain_4b("bf16").items():
                if not stage.reads_snapshot:
                    continue
                with self.subTest(stage=name):
                    texts = {variant: write_snapshot(chain_4b(variant)[name], Path(variant)).read_text()
                             for variant in MAC_GB}
                    self.assertEqual(texts["bf16"].replace("bf16", "4bit"), texts["4bit"])

    def test_long_runs_show_their_progress(self):
        """No config in config/ turns progress off, and the runner turns it off in no stage unless asked
        (`--no-progress`): a stage shows a bar with speed and ETA in a terminal, plain lines in a log."""
        def off(value) -> bool:
            if isinstance(value, dict):
                return value.get("progress") is False or any(off(v) for v in value.values())
            if isinstance(value, list):
                return any(off(v) for v in value)
            return False
        for path in sorted((ROOT / "config").rglob("*.json")):
            with self.subTest(config=str(path.relative_to(ROOT))):
                self.assertFalse(off(json.loads(path.read_text())))
        for variant in MAC_GB:
            for name, stage in chain_4b(variant).items():
                if stage.config is not None and stage.kind != "ship":
                    self.assertFalse(off(stage.config.model_dump(mode="json")), name)
                self.assertNotIn("--no-progress", [w for words in stage.commands for w in words], name)

    def test_planner_says_each_training_config_fits_its_mac(self):
        with tempfile.TemporaryDirectory() as tmp, working_folder(Path(tmp)):
            for variant, memory in MAC_GB.items():
                config = dict(CONFIG_4B, **({"quantization": {"group_size": 64, "bits": 4}} if variant == "4bit"
                                            else {}))
                model_json = Path(tmp) / f"{variant}.json"
                model_json.write_text(json.dumps(config))
                for name, stage in chain_4b(variant).items():
                    if stage.kind not in ("sft", "grpo"):
                        continue
                    with self.subTest(config=f"{name}-{variant}"):
                        path = write_snapshot(stage, Path(variant))
                        result = plan.run(plan.PlanConfig(config=str(path), model_json=str(model_json),
                                                          memory_gb=memory, json_output=True))
                        self.assertIn(memory, result["fits_mac_gb"])
                        self.assertGreater(result["peak_gb"], 2.0)     # at least the 4-bit weights


if __name__ == "__main__":
    unittest.main()
