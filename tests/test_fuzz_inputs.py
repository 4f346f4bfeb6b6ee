"""Property tests: the config loader, the JSONL reader and the reply parser on arbitrary input.

The config loader and JSONL reader must turn any input into either a result or a one-line UserError
(never another exception, never a hang); the reply parser must never raise and must classify the same
text the same way every time.
"""

from __future__ import annotations

import json
import tempfile
import unittest
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from wordle_mlx.config import StrictModel, load_config
from wordle_mlx.errors import UserError
from wordle_mlx.llm.play.prompts import REPLY_ERRORS, parse_reply
from wordle_mlx.storage.metrics import read_jsonl

FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(10 ** 30), max_value=10 ** 30)
    | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20,
)


class Lora(StrictModel):
    rank: int = 8
    scale: float = 20.0
    keys: list[str] = ["self_attn.q_proj"]


class Sample(StrictModel):
    name: str = "run"
    steps: int = 10
    lr: float = 1e-4
    lora: Lora = Lora()


class ConfigFuzzTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.path = Path(self.dir.name, "cfg.json")

    def tearDown(self):
        self.dir.cleanup()

    def _check(self, raw: bytes):
        self.path.write_bytes(raw)
        try:
            cfg = load_config(self.path, Sample)
        except UserError as err:
            message = str(err)
            self.assertNotIn("\n", message)
            self.assertIn("cfg.json", message)
            self.assertLess(len(message), 600)
        else:
            self.assertIsInstance(cfg, Sample)

    @FAST
    @given(json_values)
    def test_random_json(self, value):
        self._check(json.dumps(value).encode())

    @FAST
    @given(st.dictionaries(st.sampled_from(["name", "steps", "lr", "lora", "extra"]), json_values, max_size=5))
    def test_random_fields(self, value):
        self._check(json.dumps(value).encode())

    @FAST
    @given(st.binary(max_size=200))
    def test_random_bytes(self, raw):
        self._check(raw)

    def test_deeply_nested(self):
        self._check(b"[" * 100000 + b"]" * 100000)


class JsonlFuzzTest(unittest.TestCase):
    @FAST
    @given(st.lists(st.binary(max_size=40) | json_values.map(lambda v: json.dumps(v).encode()), max_size=6),
           st.booleans())
    def test_reader_gives_records_or_user_error(self, lines, trailing_newline):
        with tempfile.TemporaryDirectory() as d:
            path = Path(d, "metrics.jsonl")
            body = b"\n".join(line.replace(b"\n", b" ") for line in lines)
            path.write_bytes(body + (b"\n" if trailing_newline else b""))
            try:
                records = list(read_jsonl(path, warn=lambda msg: None))
            except UserError as err:
                self.assertRegex(str(err), r"metrics\.jsonl(:\d+)?: ")
                self.assertNotIn("\n", str(err))
            else:
                for lineno, record in records:
                    self.assertIsInstance(record, dict)
                    self.assertGreaterEqual(lineno, 1)

    def test_truncated_last_line_is_skipped_with_warning(self):
        with tempfile.TemporaryDirectory() as d:
            path = Path(d, "m.jsonl")
            path.write_text('{"kind": "train", "step": 1}\n{"kind": "tr')
            warnings = []
            records = list(read_jsonl(path, warn=warnings.append))
            self.assertEqual([r["step"] for _, r in records], [1])
            self.assertEqual(len(warnings), 1)
            self.assertIn("m.jsonl:2", warnings[0])

    def test_bad_middle_line_names_line_number(self):
        with tempfile.TemporaryDirectory() as d:
            path = Path(d, "m.jsonl")
            path.write_text('{"step": 1}\nnot json\n{"step": 3}\n')
            with self.assertRaises(UserError) as ctx:
                list(read_jsonl(path))
            self.assertIn("m.jsonl:2", str(ctx.exception))


class ReplyParserFuzzTest(unittest.TestCase):
    tags = st.sampled_from(["<think>", "</think>", "<guess>", "</guess>", "crane", "CRANE", " ", "\n", "\x00",
                            "\u202e", "שלום", "<guess><guess>", "zzzzz", "abc"])

    @FAST
    @given(st.lists(tags | st.text(max_size=10), max_size=30), st.booleans())
    def test_never_raises_and_is_stable(self, parts, require_think):
        text = "".join(parts)
        first = parse_reply(text, require_think, {"crane"})
        second = parse_reply(text, require_think, {"crane"})
        self.assertEqual(first, second)
        self.assertTrue(first.error is None or first.error in REPLY_ERRORS)
        if first.error is None:
            self.assertEqual(first.guess, "crane")

    def test_huge_and_odd_inputs(self):
        big = "<think>" + "a" * 10_000_000 + "</think><guess>crane</guess>"
        self.assertEqual(parse_reply(big, True, {"crane"}).guess, "crane")
        self.assertEqual(parse_reply("<think><guess>crane</guess></think>", True).error, "missing_think")
        self.assertEqual(parse_reply("<think>x</think><guess>crane", True).error, "missing_guess")
        self.assertEqual(parse_reply("\x00" * 1000, False).error, "missing_guess")
        self.assertEqual(parse_reply(None, False).error, "missing_guess")  # type: ignore[arg-type]


if __name__ == "__main__":
    unittest.main()
