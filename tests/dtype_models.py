"""The tiny random model in the Mac dtypes, for the bf16 and 4-bit tests: a bfloat16 copy and a 4-bit copy
made by mlx-lm's own converter (`mlx_lm.convert`, as `mlx-community/*-4bit` repos are made), each built once
per process in a temporary folder; and GRPO items sampled from a model by the real generator."""

from __future__ import annotations

import atexit
import shutil
import tempfile
from pathlib import Path

_built: dict[str, Path] = {}


def multimodal_wrapper(text_dir: Path, out: Path) -> None:
    """`text_dir` (a gemma3_text folder) laid out as Gemma 3 4B's multimodal checkpoint: model_type "gemma3",
    the text config under text_config, weights under language_model.*, plus vision_config and vision tensors
    (random; mlx-lm drops them on load, as it does the real 4B's)."""
    import json

    import mlx.core as mx

    out.mkdir(parents=True)
    text = json.loads((text_dir / "config.json").read_text())
    config = {"model_type": "gemma3", "architectures": ["Gemma3ForConditionalGeneration"], "text_config": text,
              "vocab_size": text["vocab_size"], "eos_token_id": text["eos_token_id"], "image_token_index": 262144,
              "mm_tokens_per_image": 256, "vision_config": {"model_type": "siglip_vision_model", "hidden_size": 16,
                                                            "num_hidden_layers": 1, "patch_size": 14},
              **({"quantization": text["quantization"]} if "quantization" in text else {})}
    (out / "config.json").write_text(json.dumps(config, indent=2))
    weights = {f"language_model.{k}": v for f in sorted(text_dir.glob("model*.safetensors"))
               for k, v in mx.load(str(f)).items()}
    weights["vision_tower.vision_model.embeddings.patch_embedding.weight"] = mx.random.normal((16, 14, 14, 3))
    weights["multi_modal_projector.mm_input_projection_weight"] = mx.random.normal((16, text["hidden_size"]))
    mx.save_safetensors(str(out / "model.safetensors"), weights, metadata={"format": "mlx"})
    for f in text_dir.iterdir():           # tokenizer, chat template, generation config
        if f.is_file() and f.name != "config.json" and not f.name.startswith("model"):
            shutil.copy(f, out / f.name)


def tiny_model_in(kind: str) -> str:
    """A model folder of `builtin:tiny-random` saved as "bfloat16", quantized to "4bit" (mlx-lm's default group
    size 64), or either wrapped as Gemma 3 4B's multimodal layout ("bfloat16-multimodal", "4bit-multimodal")."""
    if kind.endswith("-multimodal") and kind not in _built:
        out = Path(tiny_model_in(kind.removesuffix("-multimodal"))).parent / kind
        multimodal_wrapper(Path(tiny_model_in(kind.removesuffix("-multimodal"))), out)
        _built[kind] = out
    if kind not in _built:
        from mlx_lm.convert import convert

        from wordle_mlx.llm.model.models import tiny_random_dir

        root = Path(tempfile.mkdtemp(prefix="wordle-mlx-dtypes-"))
        atexit.register(shutil.rmtree, root, True)
        out = root / kind
        if kind == "bfloat16":
            convert(str(tiny_random_dir()), str(out), dtype="bfloat16")
        elif kind == "4bit":
            convert(str(tiny_random_dir()), str(out), quantize=True, q_bits=4, dtype="bfloat16")
        else:
            raise ValueError(f"unknown kind {kind!r}")
        _built[kind] = out
    return str(_built[kind])


def sampled_items(model, tokenizer, groups: int = 2, g: int = 4) -> list:
    """G replies sampled (temperature 1, the real generator) to each of `groups` prompts, as GRPO items with
    the sampler's log-probs; rewards 0, 1, ..., G - 1 within a group, so every group trains."""
    from wordle_mlx.llm.play.episode import TokenSequence
    from wordle_mlx.llm.play.generation import BatchedGenerator, SamplingConfig
    from wordle_mlx.llm.training.rl import ScoredItem

    items = []
    generate = BatchedGenerator(model, tokenizer)
    for group in range(groups):
        prompt = tokenizer.apply_chat_template([{"role": "user", "content": f"guess {group}"}],
                                               add_generation_prompt=True)
        for i, c in enumerate(generate([prompt] * g, SamplingConfig(temperature=1.0, max_tokens_per_turn=6,
                                                                    seed=group))):
            seq = TokenSequence(list(prompt) + c.tokens, [0] * len(prompt) + [1] * len(c.tokens),
                                [0.0] * len(prompt) + c.logprobs)
            items.append(ScoredItem([seq], group, float(i), {}))
    return items


def write_adapter(folder: Path, spec: str = "builtin:tiny-random", dtype=None) -> dict:
    """An adapter for model `spec` with every LoRA weight random (lora_b too, so it changes the output), saved
    in `dtype` (float32 by default); returns its weights."""
    import mlx.core as mx
    from mlx.utils import tree_map

    from wordle_mlx.llm.model import lora
    from wordle_mlx.llm.model.models import load_model

    model, _ = load_model(spec)
    mx.random.seed(11)
    params = lora.lora_parameters(4, 10.0, 0.0, None)
    lora.apply_lora(model, -1, params)
    model.update(tree_map(lambda p: (mx.random.normal(p.shape) * 0.05).astype(dtype or mx.float32),
                          model.trainable_parameters()))
    lora.save_adapters(folder, model, lora.adapter_config(-1, params, spec))
    return lora.adapter_weights(model)
