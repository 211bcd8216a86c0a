"""COMPEER policy training: GRPO on TRL with UnifiReward rewards from the reward service.

Modules: ``config`` (the GRPO config and YAML profiles), ``rewards`` (the async reward function TRL calls),
``batches`` (a generation batch's texts, rollout groups, marks and identity),
``data`` (prompt sets), ``warmup`` (optional SFT warm-up on CER outputs), ``report`` (metrics.jsonl and plots),
``overlap`` (the reward call started before TRL asks: ``reward_overlap``), ``runner`` (builds and runs the
trainer), ``cli`` (``compeer-train grpo``).
Heavy stacks (torch, trl) are imported by the modules that need them, never here.
"""
