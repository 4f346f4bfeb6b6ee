"""Training: the SFT data files (`sft_data`: made and replay-checked by the data stages, read by `sft`), the SFT loss,
the GRPO loss, group advantages, one GRPO step (rollout, then update), the step's metrics
and data parallelism over `mx.distributed`."""
