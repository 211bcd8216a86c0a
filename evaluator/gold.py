"""Reference-based evaluation on ESConv held-out turns: the model under test answers each held-out history, and its
reply is compared with the gold reply (BLEU-2, ROUGE-L), its ``<strategy>`` part with the gold strategy (accuracy,
``--model-format cer`` only), plus distinct-1/2 and mean length. No simulator or scorer is involved.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from evaluator.backends import Roles
from evaluator.inputs import GoldTurn
from evaluator.metrics import gold_figures, reply_figures
from evaluator.prompts import MODEL_FORMATS, Prompts, model_format_setting, model_reply

HARNESS = "gold"


@dataclass(frozen=True)
class GoldConfig:
    """Settings of a held-out-turn run (recorded in the run's manifest)."""

    model_format: str = model_format_setting("cer")

    def __post_init__(self) -> None:
        if self.model_format not in MODEL_FORMATS:
            raise ValueError(f"model_format {self.model_format!r}: expected plain or cer")

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


async def run_turn(item: GoldTurn, roles: Roles, prompts: Prompts, cfg: GoldConfig) -> dict[str, Any]:
    """The model's reply to one held-out history, with the gold reply and strategy beside it."""
    reply = await model_reply(roles.model, list(item.history), cfg.model_format, item.language, f"gold-{item.id}",
                              prompts)
    return {"id": item.id, "status": "ok", "history": [t.to_dict() for t in item.history], "reference": item.reference,
            "gold_strategy": item.strategy, **reply}


def summarise(records: list[dict[str, Any]], model_format: str) -> dict[str, Any]:
    """BLEU-2, ROUGE-L, strategy accuracy (cer format), distinct-1/2 and mean length over the answered turns."""
    ok = [r for r in records if r.get("status") == "ok"]
    replies = [r["text"] for r in ok]
    predicted = [r.get("strategy") for r in ok] if model_format == "cer" else None
    figures = gold_figures(replies, [r["reference"] for r in ok], predicted, [r["gold_strategy"] for r in ok])
    out = {"harness": HARNESS, "turns": len(records), "answered": len(ok), **figures,
           "replies": reply_figures(replies), "references": reply_figures([r["reference"] for r in ok])}
    if model_format == "cer":
        out["format_ok_rate"] = 100.0 * sum(1 for r in ok if r.get("format_ok")) / len(ok) if ok else None
    return out
