"""judge: the UnifiReward judge as a library.

The judge protocol (templates, round planning, verdict constraints, the SFT renderer), the engine interface and
its backends (vLLM, transformers, OpenAI-compatible), the model store, and the one generate -> validate -> retry
-> cache primitive. It depends on :mod:`cer` only; the reward service, the judge trainer and the dataset pipeline
depend on it.
"""
