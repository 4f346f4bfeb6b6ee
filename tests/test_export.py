"""`wordle-mlx export`: GGUF round trips through our own importer, the 4B folder layout, one-line errors.

Round trip: the tiny model with a LoRA adapter of random nonzero weights is exported, read back with
`gguf_import.import_gguf` and run. f32 must give the adapter model's logits within float32 rounding
(rtol 1e-5 of the largest |logit|). For f16 and q8_0 the bound is derived from the storage formats:
every stored matrix entry is checked against the fused float32 weight (f16: within half an f16 ulp,
2^-11 |w|, or 2^-25 below f16's normal range; q8_0: blocks of 32 share d = max|w| / 127, stored as
f16, so |w - q d'| <= d/2 + 127 |d - d'| <= d (1/2 + 127 * 2^-11)), and the imported model's logits
must equal, within float32 rounding, those of the model whose weights are exactly those stored values.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path
from unittest import mock

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten

from wordle_mlx.config import validate_config
from wordle_mlx.errors import UserError
from wordle_mlx.llm.model import lora
from wordle_mlx.llm.model.gguf_import import import_gguf, mlx_tensor_name
from wordle_mlx.llm.model.models import load_model, resolve_model
from wordle_mlx.llm.play.prompts import ADAPTER_PROMPT_KEY, PromptConfig, system_prompt
from wordle_mlx.llm.model.tiny_model import TINY_CONFIG, tiny_vocab
from wordle_mlx.stages import export
from wordle_mlx.stages.fuse import check_batch, fuse_lora_layers
from wordle_mlx.stages.precision import GGUF_TYPES

ROOT = Path(__file__).resolve().parent.parent
RTOL = 1e-5
PROMPT = PromptConfig(require_think=False, style="compact", guess_format="letters")
STRINGS = ("Pattern: _ e t _ _\nHas: r (not 1)\nNot: a b d i", "<guess> c r a n e</guess>",
           "<start_of_turn>user\nNo clues yet.<end_of_turn>\n", "Ünïcode ☃ and  two spaces\t")


def make_adapter(model_spec: str, folder: Path, seed: int = 3) -> None:
    """A LoRA adapter (rank 4 on every layer) with random nonzero A and B, saved in mlx-lm's format."""
    model, _ = load_model(model_spec)
    params = lora.lora_parameters(4, 2.0, 0.0, None)
    lora.apply_lora(model, -1, params)
    key = mx.random.key(seed)
    updates = []
    for name, value in tree_flatten(model.trainable_parameters()):
        key, sub = mx.random.split(key)
        updates.append((name, 0.05 * mx.random.normal(value.shape, key=sub)))
    model.load_weights(updates, strict=False)
    config = {**lora.adapter_config(-1, params, model_spec), ADAPTER_PROMPT_KEY: PROMPT.model_dump()}
    lora.save_adapters(folder, model, config)


def logits_of(model, tokenizer) -> mx.array:
    out = model(mx.array([check_batch(tokenizer)])).astype(mx.float32)
    mx.eval(out)
    return out


def run_export(adapter: Path, out: Path, gguf_type: str, model: str | None = None) -> dict:
    """export with `--dtype` the one GGUF's `gguf_type` (f32, f16, q8_0) stands for."""
    dtype = {gguf: ours for ours, gguf in GGUF_TYPES.items()}[gguf_type]
    return export.run(export.ExportConfig(adapter=str(adapter), out=str(out), model=model, dtype=dtype,
                                          json_output=True))


def stored_matrices(path: Path) -> dict:
    """mlx name -> the float32 values a GGUF stores for each matrix (dequantised)."""
    from gguf import GGUFReader
    from gguf.quants import dequantize

    reader = GGUFReader(path)
    return {mlx_tensor_name(t.name): np.asarray(dequantize(t.data, t.tensor_type), np.float32).reshape(
        tuple(int(n) for n in reversed(t.shape))) for t in reader.tensors if len(t.shape) == 2}


def storage_bound(w: np.ndarray, gguf_type: str) -> np.ndarray:
    """The largest error f16 / q8_0 storage may make on each entry of `w` (see the module docstring)."""
    if gguf_type == "f16":
        return np.maximum(np.abs(w) * 2.0 ** -11, 2.0 ** -25)
    d = np.abs(w.reshape(w.shape[0], -1, 32)).max(axis=-1, keepdims=True) / 127
    return np.broadcast_to(d * (0.5 + 127 * 2.0 ** -11), w.reshape(w.shape[0], -1, 32).shape).reshape(w.shape)


class TinyAdapterCase(unittest.TestCase):
    """A temporary folder holding a random LoRA adapter for builtin:tiny-random."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.dir = Path(cls.tmp.name)
        cls.adapter = cls.dir / "adapter"
        make_adapter("builtin:tiny-random", cls.adapter)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()


class TinyRoundTripTest(TinyAdapterCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.model, cls.tokenizer = load_model("builtin:tiny-random", adapter_path=cls.adapter)
        cls.reference = logits_of(cls.model, cls.tokenizer)
        fuse_lora_layers(cls.model)
        cls.fused = {n: np.array(v.astype(mx.float32)) for n, v in tree_flatten(cls.model.parameters())}
        cls.results = {t: run_export(cls.adapter, cls.dir / f"tiny-{t}.gguf", t) for t in ("f32", "f16", "q8_0")}

    def imported(self, gguf_type: str):
        folder = self.dir / f"imported-{gguf_type}"
        if not folder.exists():
            import_gguf(self.dir / f"tiny-{gguf_type}.gguf", folder)
        return load_model(str(folder))

    def assert_close(self, got: mx.array, want: mx.array) -> None:
        diff, scale = mx.abs(got - want).max().item(), mx.abs(want).max().item()
        self.assertLessEqual(diff, RTOL * scale, f"max |logit diff| {diff:.3g}, largest |logit| {scale:.3g}")

    def test_f32_logits_match_the_adapter_model(self):
        model, _ = self.imported("f32")
        self.assertGreater(mx.abs(self.reference).max().item(), 0.1)
        self.assert_close(logits_of(model, self.tokenizer), self.reference)

    def test_the_adapter_matters(self):
        base, tok = load_model("builtin:tiny-random")
        diff = mx.abs(logits_of(base, tok) - self.reference).max().item()
        self.assertGreater(diff, 100 * RTOL * mx.abs(self.reference).max().item())

    def test_f16_and_q8_0_store_the_rounded_fused_weights_and_run_them_exactly(self):
        for gguf_type in ("f16", "q8_0"):
            with self.subTest(gguf_type=gguf_type):
                stored = stored_matrices(self.dir / f"tiny-{gguf_type}.gguf")
                self.assertEqual(set(stored), {n for n, v in self.fused.items() if v.ndim == 2})
                for name, values in stored.items():
                    error = np.abs(values - self.fused[name])
                    self.assertTrue(np.all(error <= storage_bound(self.fused[name], gguf_type)), name)
                    self.assertGreater(error.max(), 0.0, name)     # really rounded, not stored as f32
                model, _ = self.imported(gguf_type)
                rounded, tok = load_model("builtin:tiny-random")
                rounded.load_weights([(n, mx.array(v)) for n, v in stored.items()], strict=False)
                self.assert_close(logits_of(model, self.tokenizer), logits_of(rounded, tok))

    def test_tokenizer_round_trips(self):
        _, tokenizer = self.imported("f32")
        for text in STRINGS:
            self.assertEqual(tokenizer.encode(text), self.tokenizer.encode(text), text)
        self.assertEqual(check_batch(tokenizer), check_batch(self.tokenizer))

    def test_metadata_and_modelfile(self):
        from gguf import GGUFReader

        reader = GGUFReader(self.dir / "tiny-f32.gguf")
        value = lambda key: reader.fields[key].contents()
        self.assertEqual(value("general.architecture"), "gemma3")
        self.assertEqual(json.loads(value("wordle_mlx.prompt")), PROMPT.model_dump())
        self.assertEqual(value("wordle_mlx.system_prompt"), system_prompt(PROMPT))
        self.assertEqual(value("tokenizer.chat_template"), self.tokenizer.chat_template)
        self.assertTrue(value("tokenizer.ggml.add_bos_token"))
        pieces = tiny_vocab()[0]
        self.assertEqual(pieces[value("tokenizer.ggml.bos_token_id")], "<bos>")
        self.assertEqual(pieces[value("tokenizer.ggml.eot_token_id")], "<end_of_turn>")
        self.assertEqual(value("gemma3.attention.sliding_window_pattern"), TINY_CONFIG["sliding_window_pattern"])
        self.assertEqual(value("general.file_type"), 0)
        modelfile = (self.dir / "tiny-f32.Modelfile").read_text()
        self.assertIn("FROM ./tiny-f32.gguf\n", modelfile)
        self.assertIn(f'SYSTEM """{system_prompt(PROMPT)}"""', modelfile)
        self.assertIn('PARAMETER stop "<end_of_turn>"', modelfile)
        self.assertEqual((self.results["q8_0"]["dtype"], self.results["q8_0"]["gguf_type"]), ("q8", "q8_0"))
        self.assertEqual(self.results["f32"]["non_text_tensors_left_out"], 0)


def write_wrapper_folder(folder: Path, quantize: bool, tokenizer_model: bool) -> int:
    """The tiny model in mlx-community's Gemma 3 4B layout: a `gemma3` config with `text_config`,
    `language_model.*` weights, vision tensors, embedding rows padded past the vocabulary; optionally
    4-bit and with a SentencePiece `tokenizer.model`. Returns the number of vision tensors."""
    from mlx_lm.utils import load_model as load_mlx_model, quantize_model, save_config

    tiny = Path(resolve_model("builtin:tiny-random"))
    folder.mkdir(parents=True)
    weights = {f"language_model.{n}": v for n, v in mx.load(str(tiny / "model.safetensors")).items()}
    embed = weights["language_model.model.embed_tokens.weight"]
    weights["language_model.model.embed_tokens.weight"] = mx.concatenate([embed, 0.02 * mx.ones((32, embed.shape[1]))])
    vision = {"vision_tower.vision_model.embeddings.patch_embedding.weight": mx.ones((8, 3, 2, 2)),
              "multi_modal_projector.mm_input_projection_weight": mx.ones((8, 64))}
    text_config = {k: v for k, v in TINY_CONFIG.items() if k not in ("architectures", "torch_dtype", "vocab_size")}
    config = {"model_type": "gemma3", "architectures": ["Gemma3ForConditionalGeneration"], "vocab_size": 416,
              "text_config": text_config, "vision_config": {"hidden_size": 8}}
    save_config(config, folder / "config.json")
    mx.save_safetensors(str(folder / "model.safetensors"), {**weights, **vision}, metadata={"format": "mlx"})
    if quantize:
        model, config = load_mlx_model(folder, lazy=False)
        model, config = quantize_model(model, config, 32, 4)
        mx.save_safetensors(str(folder / "model.safetensors"), {**dict(tree_flatten(model.parameters())), **vision},
                            metadata={"format": "mlx"})
        save_config(config, folder / "config.json")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tiny / name, folder / name)
    if tokenizer_model:
        from sentencepiece import sentencepiece_model_pb2

        proto = sentencepiece_model_pb2.ModelProto()
        proto.trainer_spec.model_type = sentencepiece_model_pb2.TrainerSpec.BPE
        for piece, score, kind in zip(*tiny_vocab()):
            entry = proto.pieces.add()
            entry.piece, entry.score, entry.type = piece, score, kind
        (folder / "tokenizer.model").write_bytes(proto.SerializeToString())
    return len(vision)


class FourBLayoutTest(unittest.TestCase):
    """Gemma 3 4B folders: text weights only, padded embedding rows dropped, 4-bit dequantised."""

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = Path(self.tmp.name)

    def tearDown(self):
        self.tmp.cleanup()

    def check(self, quantize: bool, tokenizer_model: bool) -> None:
        folder = self.dir / "gemma3-tiny"
        vision = write_wrapper_folder(folder, quantize, tokenizer_model)
        adapter = self.dir / "adapter"
        make_adapter(str(folder), adapter)
        model, tokenizer = load_model(str(folder), adapter_path=adapter)
        reference = logits_of(model, tokenizer)[..., :len(tiny_vocab()[0])]
        result = run_export(adapter, self.dir / "out.gguf", "f32")
        self.assertEqual(result["non_text_tensors_left_out"], vision)
        self.assertEqual(result["dequantized"], quantize)
        self.assertIn("tokenizer.model" if tokenizer_model else "tokenizer.json", result["tokenizer"])
        import_gguf(self.dir / "out.gguf", self.dir / "imported")
        imported, imported_tok = load_model(str(self.dir / "imported"))
        diff, scale = mx.abs(logits_of(imported, tokenizer) - reference).max().item(), mx.abs(reference).max().item()
        self.assertLessEqual(diff, RTOL * scale)
        for text in STRINGS:
            self.assertEqual(imported_tok.encode(text), tokenizer.encode(text), text)

    def test_bf16_style_folder_with_tokenizer_json(self):
        self.check(quantize=False, tokenizer_model=False)

    def test_4bit_folder_with_sentencepiece_model(self):
        self.check(quantize=True, tokenizer_model=True)


def write_llama_folder(folder: Path) -> None:
    """A tiny Llama model (same shapes as the tiny Gemma) with the tiny tokenizer: an unsupported architecture."""
    from mlx_lm.models.llama import Model, ModelArgs

    config = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "intermediate_size": 128,
              "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 16, "rms_norm_eps": 1e-6,
              "vocab_size": 384, "tie_word_embeddings": True}
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(config))
    model = Model(ModelArgs.from_dict(config))
    mx.save_safetensors(str(folder / "model.safetensors"), dict(tree_flatten(model.parameters())))
    tiny = Path(resolve_model("builtin:tiny-random"))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tiny / name, folder / name)


class ExportErrorsTest(TinyAdapterCase):
    """One line on stderr, exit 2, and nothing left in the output folder."""

    def cli_fails(self, *args: str) -> str:
        out_dir = self.dir / "out"
        shutil.rmtree(out_dir, ignore_errors=True)
        out_dir.mkdir()
        proc = subprocess.run([sys.executable, "-m", "wordle_mlx", "export", "--out", str(out_dir / "x.gguf"), *args],
                              capture_output=True, text=True, cwd=ROOT, timeout=600,
                              env={**os.environ, "PYTHONPATH": str(ROOT), "WORDLE_MLX_NO_REEXEC": "1"})
        self.assertEqual(proc.returncode, 2, proc.stderr)
        lines = proc.stderr.strip().splitlines()
        self.assertEqual(len(lines), 1, proc.stderr)
        self.assertEqual(list(out_dir.iterdir()), [])
        return lines[0]

    def test_bad_adapter_folder(self):
        broken = self.dir / "broken"
        broken.mkdir(exist_ok=True)
        (broken / "adapter_config.json").write_text("{}")
        self.assertIn("missing adapters.safetensors", self.cli_fails("--adapter", str(broken)))
        self.assertIn("no such folder", self.cli_fails("--adapter", str(self.dir / "nowhere")))

    def test_unsupported_architecture(self):
        llama = self.dir / "llama"
        if not llama.exists():
            write_llama_folder(llama)
        line = self.cli_fails("--adapter", str(self.adapter), "--model", str(llama))
        self.assertIn("architecture 'llama' is not supported", line)

    def test_failure_while_writing_leaves_nothing(self):
        out_dir = self.dir / "midway"
        out_dir.mkdir()
        real, calls = export.to_numpy, []

        def fail_on_third(*args):
            calls.append(1)
            if len(calls) == 3:
                raise UserError("disk full (simulated)")
            return real(*args)

        with mock.patch.object(export, "to_numpy", fail_on_third), self.assertRaises(UserError):
            run_export(self.adapter, out_dir / "x.gguf", "f32")
        self.assertEqual(len(calls), 3)
        self.assertEqual(list(out_dir.iterdir()), [])

    def test_dtype_it_cannot_write_and_the_old_type_field(self):
        self.assertEqual(self.cli_fails("--adapter", str(self.adapter), "--dtype", "bfloat16"),
                         "error: command line: dtype: export --dtype 'bfloat16': export writes float32, float16, q8 "
                         "(got 'bfloat16')")
        with self.assertRaisesRegex(UserError, "^x.json: gguf_type: unknown field"):
            validate_config({"adapter": "a", "out": "x.gguf", "gguf_type": "f16"}, export.ExportConfig, "x.json")

    def test_out_must_be_gguf_and_is_not_overwritten(self):
        with self.assertRaisesRegex(UserError, "must end in .gguf"):
            run_export(self.adapter, self.dir / "x.bin", "f32")
        existing = self.dir / "exists.gguf"
        existing.write_text("keep me")
        with self.assertRaisesRegex(UserError, "already exists"):
            run_export(self.adapter, existing, "f32")
        self.assertEqual(existing.read_text(), "keep me")


if __name__ == "__main__":
    unittest.main()
