"""Evaluation of emotional-support chat models: ESC-Eval-style and SAGE-style multi-turn simulation, ESConv
held-out-turn metrics and human pairwise evaluation (``compeer-eval``; docs/evaluator.md)."""
