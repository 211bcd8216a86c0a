"""The transformers backend, split by concern:

- :mod:`~judge.engines.hf.engine`: :class:`TransformersEngine`, the lifecycle, request queue and micro-batching loop;
- :mod:`~judge.engines.hf.runner`: the model thread, the loaded model and one ``model.generate`` call per batch;
- :mod:`~judge.engines.hf.grammar`: the grammar backends (xgrammar, llguidance) and their per-row matchers;
- :mod:`~judge.engines.hf.mask`: the logits processor that fills and applies each step's grammar mask;
- :mod:`~judge.engines.hf.logprobs`: ``GenParams.logprobs``, the unmasked top-k log-probabilities of each step;
- :mod:`~judge.engines.hf.line_bound`: ``GenParams.max_line_chars`` from a table of token byte lengths;
- :mod:`~judge.engines.hf.static_cache`: the reused static KV cache for CUDA graphs;
- :mod:`~judge.engines.hf.stats`: per-call counters and timings.
"""
