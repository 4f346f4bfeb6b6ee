"""scripts/heldout_secrets.py and heldout_wins.py: held-out words leave SFT data, and their wins split by block."""

from __future__ import annotations

import json
import tempfile
import unittest
from pathlib import Path

from . import load_script

heldout_secrets = load_script("heldout_secrets")
heldout_wins = load_script("heldout_wins")


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


class HeldoutWinsTest(unittest.TestCase):
    def test_counts_gains_and_losses_per_group(self):
        start = {"a": False, "b": True, "c": False, "d": True}
        after = {"a": True, "b": True, "c": True, "d": False}
        out = heldout_wins.rows(start, after, [("played", ["a", "b", "c"]), ("other", ["d"])])
        self.assertEqual([(r["start"], r["after"], r["gained"], r["lost"]) for r in out], [(1, 3, 2, 0), (1, 0, 0, 1)])
        self.assertAlmostEqual(out[0]["p"], 0.5)
        self.assertEqual(out[1]["p"], 1.0)


if __name__ == "__main__":
    unittest.main()
