"""data_builder: the CER dataset pipeline, from raw ESC corpora to judge SFT and GRPO prompt sets.

Each stage is one module and one command (``compeer-data <stage> [options] --out DIR INPUT...``):
:mod:`~data_builder.ingest`, :mod:`~data_builder.llm_filter`, :mod:`~data_builder.sample`,
:mod:`~data_builder.generate`, :mod:`~data_builder.silver`, :mod:`~data_builder.annotate`,
:mod:`~data_builder.persona` and :mod:`~data_builder.emit`. Stages talk through files on disk (JSONL records
described in :mod:`data_builder.records`, plus ``DIR/manifest.json``), so each can be re-run on its own.
See ``docs/data_builder.md``.
"""
