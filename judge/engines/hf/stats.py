"""Per-call timings and counters of the transformers engine (tests and ``bench.hf_judge_engine`` read them)."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import ClassVar


@dataclass
class GenerateStats:
    """Counters of the micro-batcher and the time split of each ``model.generate`` call.

    The per-call lists keep the latest calls only: once a list holds ``2 * keep`` entries, ``trim`` drops all but
    the last ``keep`` (a long-running server must not grow without bound).
    """

    keep: ClassVar[int] = 50_000

    batches: int = 0
    requests: int = 0
    dropped_cancelled: int = 0
    output_tokens: int = 0
    batch_sizes: list[int] = field(default_factory=list)
    decode_steps: list[int] = field(default_factory=list)  # new-token positions each generate() call ran
    # seconds per generate() call: rendering + tokenising + padding, then model.generate() itself
    prep_s: list[float] = field(default_factory=list)
    generate_s: list[float] = field(default_factory=list)
    # constrained calls only: seconds from the generate() start to the first mask call (prefill), then summed over
    # the decoding positions: waiting for the step's tokens on the host, the mask's own host work (xgrammar, the
    # mask's copy to the device and its apply), and the rest of the host loop (transformers' generate loop and
    # kernel launches between two mask calls)
    prefill_s: list[float] = field(default_factory=list)
    first_decode_s: list[float] = field(default_factory=list)  # first mask call to the second (the first decode step)
    device_wait_s: list[float] = field(default_factory=list)
    mask_host_s: list[float] = field(default_factory=list)
    loop_host_s: list[float] = field(default_factory=list)
    # constrained positions whose tokens the mask had to read itself (no tap for the step; expected 0)
    untapped_positions: int = 0

    def trim(self) -> None:
        """Drop all but the latest ``keep`` entries of each per-call list that holds ``2 * keep`` or more."""
        for f in fields(self):
            values = getattr(self, f.name)
            if isinstance(values, list) and len(values) >= 2 * self.keep:
                del values[:-self.keep]
