"""The metrics JSONL writer, the resume-time truncation that keeps steps unique, and the old SFT kinds."""

from __future__ import annotations

import json
import math
import tempfile
import unittest
from pathlib import Path

from wordle_mlx.storage.metrics import MetricsWriter, read_jsonl, record_kind, truncate_after_step


class MetricsTest(unittest.TestCase):
    def test_writer_is_strict_json_and_appends(self):
        with tempfile.TemporaryDirectory() as d:
            path = Path(d, "m.jsonl")
            with MetricsWriter(path) as w:
                w.write({"kind": "train", "step": 1, "loss": math.nan, "x": [1.0, math.inf]})
            with MetricsWriter(path) as w:
                w.write({"kind": "train", "step": 2})
            lines = path.read_text().splitlines()
            self.assertEqual(len(lines), 2)
            self.assertEqual(json.loads(lines[0]), {"kind": "train", "step": 1, "loss": None, "x": [1.0, None]})

    def test_record_kind_reads_sfts_old_kinds_as_todays(self):
        self.assertEqual([record_kind({"kind": k}) for k in ("sft", "sft_valid", "train", "valid", "run", "eval")],
                         ["train", "valid", "train", "valid", "run", "eval"])
        self.assertEqual((record_kind({}), record_kind({"kind": ["sft"]})), (None, None))

    def test_truncate_after_step_drops_later_steps_only(self):
        with tempfile.TemporaryDirectory() as d:
            path = Path(d, "m.jsonl")
            path.write_text('{"kind": "run", "step": null}\n{"kind": "train", "step": 1}\n'
                            '{"kind": "valid", "step": 2}\n{"kind": "train", "step": 3}\n{"kind": "train", "st')
            self.assertEqual(truncate_after_step(path, 2), 1)
            steps = [r.get("step") for _, r in read_jsonl(path)]
            self.assertEqual(steps, [None, 1, 2])
            self.assertTrue(path.read_text().endswith("\n"))
            self.assertEqual(truncate_after_step(Path(d, "missing.jsonl"), 0), 0)


if __name__ == "__main__":
    unittest.main()
