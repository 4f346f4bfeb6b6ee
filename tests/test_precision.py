"""`--dtype` of fuse, export and model import: one vocabulary (stages/precision.py), each command its subset, the rest
refused with one line naming the command, the value and what it writes; the old fields are unknown fields."""

from __future__ import annotations

import tempfile
import unittest
from pathlib import Path

from wordle_mlx.config import load_config, validate_config
from wordle_mlx.errors import UserError
from wordle_mlx.stages import export, fuse, model_import
from wordle_mlx.stages.precision import DTYPES, EXPORT_DTYPES, FUSE_DTYPES, IMPORT_DTYPES

CASES = (("fuse", fuse.FuseConfig, {"adapter": "a", "out": "o"}, FUSE_DTYPES),
         ("export", export.ExportConfig, {"adapter": "a", "out": "o.gguf"}, EXPORT_DTYPES),
         ("model import", model_import.ModelImportConfig, {"source": "builtin:tiny-random"}, IMPORT_DTYPES))


class DtypeVocabularyTest(unittest.TestCase):
    def test_each_command_takes_its_subset_and_refuses_the_rest_in_one_line(self):
        for command, model, fields, accepted in CASES:
            for value in (*DTYPES, "f16", "q8_0", "int8"):
                with self.subTest(command=command, value=value):
                    if value in accepted:
                        self.assertEqual(load_config(None, model, {**fields, "dtype": value}).dtype, value)
                        continue
                    with self.assertRaises(UserError) as ctx:
                        load_config(None, model, {**fields, "dtype": value})
                    message = str(ctx.exception)
                    self.assertEqual(len(message.splitlines()), 1)
                    self.assertIn(f"{command} --dtype {value!r}: {command} writes {', '.join(accepted)}", message)

    def test_old_field_names_are_unknown_fields(self):
        for model, fields, old, got in ((export.ExportConfig, {"adapter": "a", "out": "o.gguf"}, {"gguf_type": "f16"},
                                         "'f16'"),
                                        (model_import.ModelImportConfig, {"source": "x.gguf"}, {"q_bits": 4}, "4")):
            with self.subTest(old=old), self.assertRaises(UserError) as ctx:
                validate_config({**fields, **old}, model, "x.json")
            self.assertEqual(str(ctx.exception), f"x.json: {next(iter(old))}: unknown field (got {got})")

    def test_import_quantized_dtypes(self):
        cfg = load_config(None, model_import.ModelImportConfig, {"source": "x.gguf", "dtype": "q4"})
        self.assertEqual((cfg.q_bits, cfg.float_dtype), (4, None))
        cfg = load_config(None, model_import.ModelImportConfig, {"source": "x.gguf", "dtype": "bfloat16"})
        self.assertEqual((cfg.q_bits, cfg.float_dtype), (None, "bfloat16"))
        with self.assertRaisesRegex(UserError, "model import --dtype q8: needs --out DIR"):
            model_import.run(load_config(None, model_import.ModelImportConfig,
                                         {"source": "builtin:tiny-random", "dtype": "q8", "json_output": True}))
        with tempfile.TemporaryDirectory() as tmp:
            with self.assertRaisesRegex(UserError, "builtin:tiny-random is float32 only"):
                model_import.run(load_config(None, model_import.ModelImportConfig, {
                    "source": "builtin:tiny-random", "out": str(Path(tmp, "m")), "dtype": "q4", "json_output": True}))
            self.assertEqual(list(Path(tmp).iterdir()), [])


if __name__ == "__main__":
    unittest.main()
