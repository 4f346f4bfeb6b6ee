"""The Mac rehearsal's test material: random checkpoints laid out like mlx-community's Gemma 3 4B repos
(`mac_layouts`), and the 4B recipe's configs made small with a sampler whose first reply to a board is a word
(`recipe`). Used by tests/test_mac_rehearsal.py (tiny checkpoints) and benchmarks/gemma3_4b_size.py (full size);
nothing in `wordle_mlx` imports it.
"""
