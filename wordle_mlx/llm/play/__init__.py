"""Decoding and play: the prompts and the reply parser, free, grammar and words decoding, the lockstep rollout
engine that plays whole games, the episodes it leaves for the trainer, candidate scores and the GBNF export of the
reply grammar."""
