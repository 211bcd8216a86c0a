"""The policy's prompt: the system message that asks for the CER format, and the dialogue as chat turns.

Used by the GRPO trainer, the SFT warm-up, data_builder's generation stage and the evaluator, so the policy
always sees the same instructions.
"""

from __future__ import annotations

from cer.dialogue import Role, Turn
from cer.reasoning import PARTS
from cer.taxonomy import Taxonomy, load_taxonomy

Message = dict[str, str]

SYSTEM_TEMPLATE = (
    "You are an emotional-support assistant talking with a help seeker. Before you reply, reason in three "
    "steps, then write the reply, using exactly these tags in this order:\n"
    "<analysis>the seeker's core issue and the stage of support ({stages})</analysis>\n"
    "<emotion>the seeker's sentiment ({sentiments}), fine-grained emotion and intensity "
    "({lo}-{hi})</emotion>\n"
    "<strategy>one strategy from: {strategies}; and why</strategy>\n"
    "<response>your reply to the seeker</response>"
)


def system_prompt(taxonomy: Taxonomy | None = None) -> str:
    """The system message asking for the CER output format."""
    tax = taxonomy or load_taxonomy()
    return SYSTEM_TEMPLATE.format(stages=", ".join(tax.stages), sentiments=", ".join(tax.sentiments),
                                  lo=tax.intensity[0], hi=tax.intensity[1], strategies="; ".join(tax.names))


def policy_messages(history: list[Turn], taxonomy: Taxonomy | None = None) -> list[Message]:
    """Chat messages for the policy: the system prompt, then seeker turns as user and supporter turns as assistant."""
    messages: list[Message] = [{"role": "system", "content": system_prompt(taxonomy)}]
    for t in history:
        messages.append({"role": "user" if t.role is Role.SEEKER else "assistant", "content": t.text})
    return messages


__all__ = ["PARTS", "Message", "policy_messages", "system_prompt"]
