"""`wordle-mlx entropy`: the offline information-theory precompute.

Builds (or loads from the user cache) the pattern matrix of every allowed guess against the candidate
set, the 2,315 answers by default or all allowed words with `candidates="allowed"`, and ranks guesses
by the Shannon entropy of their feedback distribution. The cache is keyed by a hash of the lists.
"""

from __future__ import annotations

import time
from typing import Literal

import numpy as np
from rich.table import Table

from ..config import StrictModel
from ..runtime.progress import console
from .pattern_table import load_table


class EntropyConfig(StrictModel):
    candidates: Literal["answers", "allowed"] = "answers"
    answers_list: str = "answers"
    allowed_list: str = "allowed"
    top: int = 10
    json_output: bool = False


def run(cfg: EntropyConfig) -> dict:
    start = time.perf_counter()
    table = load_table(cfg.answers_list, cfg.allowed_list, cfg.candidates, show_progress=not cfg.json_output)
    bits = table.entropies()
    order = np.lexsort((np.arange(len(bits)), -np.round(bits, 9)))[: cfg.top]
    seconds = time.perf_counter() - start
    result = {
        "candidates": cfg.candidates,
        "num_guesses": len(table.guesses),
        "num_candidates": len(table.answers),
        "top": [{"word": table.guesses[i], "bits": round(float(bits[i]), 4)} for i in order],
        "seconds": round(seconds, 3),
    }
    if not cfg.json_output:
        out = Table(title=f"Top {cfg.top} guesses by entropy over {len(table.answers)} candidates")
        out.add_column("rank", justify="right")
        out.add_column("word")
        out.add_column("bits", justify="right")
        for rank, row in enumerate(result["top"], start=1):
            out.add_row(str(rank), row["word"].upper(), f"{row['bits']:.4f}")
        console.print(out)
        console.print(f"{len(table.guesses)} guesses x {len(table.answers)} candidates in {seconds:.2f} s")
    return result
