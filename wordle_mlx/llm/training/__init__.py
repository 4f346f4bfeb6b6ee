"""Training: the SFT loss, the GRPO loss, group advantages, one GRPO step (rollout, then update), the step's metrics
and data parallelism over `mx.distributed`."""
