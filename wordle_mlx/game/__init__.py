"""The pure Wordle engine: word lists, feedback, game state, knowledge, entropy, solver, rewards.

Stdlib and numpy only; importing this package never imports mlx.
"""

from .feedback import ALL_GREEN, code_to_pattern, feedback, pattern_matrix, pattern_to_code
from .knowledge import Knowledge, candidates, is_consistent
from .state import MAX_GUESSES, GameState, check_guess
from .words import allowed, answers, check_word, guess_list, load_word_list

__all__ = [
    "ALL_GREEN", "MAX_GUESSES", "GameState", "Knowledge", "allowed", "answers", "candidates",
    "check_guess", "check_word", "code_to_pattern", "feedback", "guess_list", "is_consistent",
    "load_word_list", "pattern_matrix", "pattern_to_code",
]
