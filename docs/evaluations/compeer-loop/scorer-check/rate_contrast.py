"""Is the loop's independent scorer informative? (issue 26, item 4: a scorer a skeptic accepts must itself tell a
better supporter reply from a worse one.) Rates, as the loop's scorer did before it compared (the same prompt,
strict `Rating: N` parse, a failed parse recorded as failed: `rating_messages`, `parse_rating`, `rate_replies` below,
moved here unchanged from `compeer_loop.independent`), the real supporter reply of each valid contrast
group and each of its negatives that differ in the reply (`compeer-data contrast --pool eval`: degenerate, generic,
dismissive, echo, another round's and another dialogue's real reply, the policy-made kinds), then per kind the AUC of
the rating (real reply vs negative, ties half), the within-group win / tie / loss shares and the rating counts.

    PYTHONPATH=. .venv/bin/python docs/evaluations/compeer-loop/scorer-check/rate_contrast.py GROUPS.jsonl OUT.json \
        [--groups 40] [--model qwen2.5-coder-1.5b] [--backend vllm] [--device cpu] [--pairwise]

--pairwise: instead of a 1-5 rating of each reply alone, the same model compares the real reply with each negative,
`Better: A` or `Better: B`, in both orders (position bias cancels); the real reply's score in a pair is its wins
(0, 1 or 2 of 2), and the kind's "AUC" is the mean share won (ties = one win each way = 0.5). Written once and run
once on these groups (nothing tuned on them). Its prompt, parse and order swap are the loop's scorer now
(`compeer_loop.independent`: `pair_messages`, `parse_better`, `ask_both_orders`).

GROUPS.jsonl: `bash tools/gpu/esconv_data.sh ../shared/data/esconv W` -> W/contrast/groups.jsonl (the valid split)."""
from __future__ import annotations

import argparse
import asyncio
import json
import re
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cer.reasoning import parse
from compeer_loop.independent import RUBRIC, ask_both_orders, conversation_text, win_value
from evaluator.backends import ChatRole, EngineError, ModelSpec, build_roles
from reward_trainer.contrast import summarise

#: the negatives whose reply differs from the real turn's (the others change only the reasoning parts)
REPLY_KINDS = ("degenerate", "generic", "dismissive", "echo", "other_round", "other_dialogue", "policy_degenerate",
               "policy_generic", "policy_echo")


RATING_MIN, RATING_MAX = 1, 5
_RATING = re.compile(r"^\s*rating\s*:\s*(\d+)\s*$", re.IGNORECASE | re.MULTILINE)
SYSTEM = ("You rate replies in emotional-support conversations. You are strict and use the whole scale. Answer with "
          "exactly one line: `Rating: N`, N from 1 to 5.")


def parse_rating(text: str) -> int | None:
    """N of the answer's one ``Rating: N`` line, when N is in 1-5; None for no such line, several, or N outside."""
    hits = _RATING.findall(text)
    if len(hits) != 1:
        return None
    value = int(hits[0])
    return value if RATING_MIN <= value <= RATING_MAX else None


def rating_messages(history: Sequence[dict[str, Any]], reply: str) -> list[dict[str, str]]:
    """The zero-shot rating prompt of one reply in its conversation."""
    user = (f"Conversation so far:\n{conversation_text(history)}\n\nThe supporter's next reply:\n{reply}\n\nRate how well this reply "
            f"supports the seeker. {RUBRIC}\nAnswer `Rating: N`.")
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}]


async def rate_replies(records: Sequence[dict[str, Any]], scorer: ChatRole,
                       concurrency: int = 16) -> dict[str, dict[str, Any]]:
    """Per answered record id: ``independent_rating`` (None when failed), ``independent_status`` (``ok`` |
    ``failed`` | ``engine_error``) and the scorer's identity."""
    gate = asyncio.Semaphore(concurrency)

    async def one(r: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        async with gate:
            try:
                done = await scorer.ask(rating_messages(r.get("history") or [], str(r.get("text", ""))),
                                        parse_rating, f"rate-{r['id']}")
            except EngineError as exc:  # an engine failure: recorded, the rating stays absent
                return r["id"], {"independent_rating": None, "independent_status": "engine_error",
                                 "independent_error": str(exc)[:200], "independent_scorer": scorer.identity}
        status = "ok" if done.value is not None else "failed"
        return r["id"], {"independent_rating": done.value, "independent_status": status,
                         "independent_scorer": scorer.identity}

    pairs = await asyncio.gather(*(one(r) for r in records if r.get("status") == "ok"))
    return dict(pairs)


def records(groups: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for i, g in enumerate(groups):
        for kind, text in g["candidates"].items():
            if kind != "positive" and kind not in REPLY_KINDS:
                continue
            reply = parse(text).parts.get("response")
            if reply:  # a candidate whose reply part does not parse is not rated (counted in the output)
                out.append({"id": f"{i}:{kind}", "history": g["history"], "text": reply, "status": "ok"})
    return out


def summary(groups: int, rated: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The ratings' counts, then per kind the AUC, within-group shares and mean rating, computed as the reward AUC
    of the judges is (:func:`reward_trainer.contrast.summarise`, the rating in place of the total)."""
    by_group: dict[int, dict[str, float | None]] = {}
    for rid, r in rated.items():
        i, kind = rid.split(":", 1)
        by_group.setdefault(int(i), {})[kind] = r["independent_rating"]
    out = summarise([by_group[i] for i in sorted(by_group)])
    out.update(groups=groups, ratings=dict(Counter(str(r["independent_rating"]) for r in rated.values())),
               failed=sum(r["independent_status"] != "ok" for r in rated.values()))
    return out


async def compare(recs: list[dict[str, Any]], scorer: Any) -> dict[str, dict[str, Any]]:
    """Per negative record id: the real reply's wins over it in both orders (None when an answer failed)."""
    real = {r["id"].split(":")[0]: r for r in recs if r["id"].endswith(":positive")}
    gate = asyncio.Semaphore(16)

    async def one(r: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        pos = real[r["id"].split(":")[0]]
        first, second = await ask_both_orders(scorer, r["history"], pos["text"], r["text"], r["id"], gate)
        won = win_value(first, second)  # the real reply's share of the two orders
        wins = None if won is None else int(2 * won)
        return r["id"], {"real_first": first, "real_second": second, "real_wins": wins}

    negs = [r for r in recs if not r["id"].endswith(":positive") and r["id"].split(":")[0] in real]
    return dict(await asyncio.gather(*(one(r) for r in negs)))


def pair_summary(groups: int, done: dict[str, dict[str, Any]]) -> dict[str, Any]:
    answers = [x for d in done.values() for x in (d["real_first"], d["real_second"]) if x is not None]
    out: dict[str, Any] = {"groups": groups, "failed": sum(d["real_wins"] is None for d in done.values()), "kinds": {},
                           "first_position_share": sum(x == "A" for x in answers) / len(answers) if answers else None}
    for kind in REPLY_KINDS:
        w = [d["real_wins"] for rid, d in done.items() if rid.split(":", 1)[1] == kind and d["real_wins"] is not None]
        if w:
            out["kinds"][kind] = {"n": len(w), "auc": sum(w) / (2 * len(w)), "both": sum(x == 2 for x in w) / len(w),
                                  "split": sum(x == 1 for x in w) / len(w), "neither": sum(x == 0 for x in w) / len(w)}
    return out


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("groups_file"), ap.add_argument("out")
    ap.add_argument("--groups", type=int, default=40)
    ap.add_argument("--model", default="qwen2.5-coder-1.5b")
    ap.add_argument("--backend", default="vllm")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--pairwise", action="store_true")
    args = ap.parse_args()
    lines = Path(args.groups_file).read_text().splitlines()
    groups = [json.loads(line) for line in lines[: args.groups]]
    spec = ModelSpec(model=args.model, backend=args.backend, device=args.device, adapter="none", max_tokens=16,
                     temperature=0.0)
    roles = build_roles({r: spec for r in ("model", "simulator", "scorer")}, None)
    t0 = time.monotonic()
    try:
        if args.pairwise:
            rated = await compare(records(groups), roles.scorer)
        else:
            rated = await rate_replies(records(groups), roles.scorer, concurrency=16)
    finally:
        await roles.aclose()
    out = pair_summary(len(groups), rated) if args.pairwise else summary(len(groups), rated)
    out.update(scorer=roles.scorer.identity, backend=args.backend, device=args.device, seconds=time.monotonic() - t0,
               groups_file=args.groups_file)
    Path(args.out).write_text(json.dumps({"summary": out, "ratings": rated}, indent=1) + "\n")
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    asyncio.run(main())
