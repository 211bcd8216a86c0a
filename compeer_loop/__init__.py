"""The COMPEER loop end to end on real data: prompt sets from ESConv, a plan of policy arms trained with GRPO
against different judges (resumable, run concurrently on one GPU), their evaluation on valid-split prompts, and one
report. Modules: :mod:`compeer_loop.prompts`, :mod:`compeer_loop.plan`, :mod:`compeer_loop.runner`,
:mod:`compeer_loop.evaluate`, :mod:`compeer_loop.stats`, :mod:`compeer_loop.report`, :mod:`compeer_loop.cli`.
"""
