"""The transformers backend (:class:`judge.engines.hf.engine.TransformersEngine`), split by concern."""
