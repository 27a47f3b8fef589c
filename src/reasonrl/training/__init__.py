"""The run harness that supervised fine-tuning, expert iteration and GRPO share: the policy (loaded, trained, saved),
AdamW and its learning-rate schedule, validation and the best weights, resumable checkpoints, the cadence of a run's
evaluations, checkpoints and kept policies, per-phase timings, and the stage skeleton around a route's loop."""
