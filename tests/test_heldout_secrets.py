"""scripts/heldout_secrets.py: held-out words leave SFT data both as secrets and as labels, nothing else does."""

from __future__ import annotations

import importlib.util
import json
import tempfile
import unittest
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "heldout_secrets.py"
spec = importlib.util.spec_from_file_location("heldout_secrets", SCRIPT)
heldout_secrets = importlib.util.module_from_spec(spec)
spec.loader.exec_module(heldout_secrets)


def example(secret: str, label: str) -> dict:
    reply = "<guess> " + " ".join(label) + "</guess>"
    return {"messages": [{"role": "user", "content": "Pattern: _ _ _ _ _"}, {"role": "assistant", "content": reply}],
            "meta": {"secret": secret, "history": ["raise"], "target": label}}


class HeldoutSecretsTest(unittest.TestCase):
    def test_reply_word_reads_letters_and_whole_words(self):
        self.assertEqual(heldout_secrets.reply_word(example("crane", "crane")), "crane")
        whole = {"messages": [{"role": "assistant", "content": "<think>x</think><guess>SLATE</guess>"}]}
        self.assertEqual(heldout_secrets.reply_word(whole), "slate")
        with self.assertRaises(ValueError):
            heldout_secrets.reply_word({"messages": [{"role": "assistant", "content": "crane"}]})

    def test_drops_held_secrets_and_held_labels_only(self):
        rows = [example("crane", "crane"), example("slate", "crane"), example("slate", "slate"),
                example("pious", "pious"), example("crane", "pious")]
        with tempfile.TemporaryDirectory() as tmp:
            src, dst = Path(tmp) / "train.jsonl", Path(tmp) / "out.jsonl"
            src.write_text("".join(json.dumps(r) + "\n" for r in rows) + "\n")
            stats = heldout_secrets.filter_split(src, dst, {"crane"})
            kept = [json.loads(line) for line in dst.read_text().splitlines()]
        self.assertEqual(stats, {"kept": 2, "dropped_secret": 2, "dropped_label": 1})
        self.assertEqual([(r["meta"]["secret"], r["meta"]["target"]) for r in kept],
                         [("slate", "slate"), ("pious", "pious")])


if __name__ == "__main__":
    unittest.main()
