"""Stage ``contrast``: groups that measure whether a judge's *reward* tells a real supporter turn from a worse one.

For each round (stage 3 output, usually of held-out dialogues) one group: the real supporter turn with correct
reasoning (``positive``) and one candidate per kind of negative, each differing from the positive in one part only
(same phrasings):

- ``similar_problem``: step 1 states the situation of another dialogue with the same problem type;
- ``wrong_emotion``: step 2 names an emotion of another family, or a positive one;
- ``unused_strategy``: step 3 names a strategy the annotators did not use at this turn;
- ``stage_mismatch``: step 3 names a strategy of another support stage than this moment's (e.g. Providing
  Suggestions while the seeker is being explored);
- ``other_round``: the reply of another round of the same dialogue (at least ``min_round_distance`` away);
- ``other_dialogue``: a reply from another dialogue with the same problem type;
- ``degenerate``, ``generic``, ``dismissive``, ``echo``: a hack a policy writes to game the judge, built by rule from
  the ``eval`` pool of ``silver.yaml`` (disjoint from the texts the training items use; :mod:`data_builder.negatives`);
- ``policy_degenerate``, ``policy_generic``, ``policy_dismissive``, ``policy_echo`` (with ``--policy-negatives``):
  what GRPO policies really wrote on valid prompts, marked by ``compeer-data policy-negatives``: the text written on
  this very prompt when there is one, else a conversation-free one written on another valid prompt;
  ``policy_misfit``: a reply a policy wrote on this very prompt naming (and carrying out) a strategy of another
  support stage than this moment's, its step 3 naming that strategy (``policy-negatives --stage-misfit``).

Reply negatives keep the positive's reasoning parts word for word; step negatives keep its reply. ``negatives`` in
each group says, per kind built by rule or taken from a policy, how (rule, policy, prompt).

Each group carries two references: ``gold`` (the real supporter turn, as GRPO sends it: the positive's reply is then
identical to the reference) and ``other_round`` (the reply of yet another round, so no candidate repeats the
reference). ``reward_trainer``'s ``judge-contrast`` scores every group through the service core and reports the AUC
of the total reward, positive vs each kind, under both references. A kind that cannot be built for a round (no
similar dialogue, too few rounds) is left out of that group and counted.
"""

from __future__ import annotations

import argparse
import random
from collections import Counter
from pathlib import Path
from typing import Any

from cer.reasoning import render
from cer.taxonomy import Taxonomy, load_taxonomy
from data_builder.negatives import HACK_KINDS, POLICY_MISFIT, POLICY_PREFIX, HackMaker, PolicyPool
from data_builder.records import DIALOGUE, ROUND, Record, read_records, write_jsonl
from data_builder.silver import gold_rounds
from data_builder.silver_text import REPLY_POOLS, Facts, SilverConfig, load_config, render_steps
from data_builder.stage import StageRun, add_common, limited, stable_seed

CONTRAST_GROUP = "contrast_group"
POLICY_KINDS: tuple[str, ...] = (*(POLICY_PREFIX + k for k in HACK_KINDS), POLICY_MISFIT)
NEGATIVE_KINDS: tuple[str, ...] = ("similar_problem", "wrong_emotion", "unused_strategy", "stage_mismatch",
                                   "other_round", "other_dialogue", *HACK_KINDS, *POLICY_KINDS)


def _steps(facts: Facts, lang: str, taxonomy: Taxonomy, cfg: SilverConfig, seed: int) -> dict[str, str]:
    # one phrasing per group: every candidate of the group is rendered from the same generator state
    return render_steps(facts, lang, taxonomy, cfg, random.Random(seed))


def build_contrast(rounds: list[Record], taxonomy: Taxonomy, cfg: SilverConfig, seed: int = 0,
                   dialogues: list[Record] | None = None, pool: str = "eval",
                   policy: PolicyPool | None = None) -> tuple[list[Record], Counter[str]]:
    """Contrast groups from round records (see the module docstring); returns groups and counts. ``pool``: the
    rule-made hack texts (``eval`` unless the groups are for a training split); ``policy``: policy-made negatives."""
    counts: Counter[str] = Counter()
    usable, pools = gold_rounds(rounds, taxonomy, cfg, dialogues, counts)
    hacks = HackMaker(cfg, taxonomy, pool, policy)
    groups: list[Record] = []
    for r, facts, fam in usable:
        rng = random.Random(stable_seed("contrast", seed, r["dialogue_id"], r["round_index"]))
        lang, phr = r.get("lang", "en"), rng.randrange(2**31)
        gold = r["reference"]
        steps = _steps(facts, lang, taxonomy, cfg, phr)
        cands: dict[str, str] = {"positive": render({**steps, "response": gold})}
        similar = pools.similar_situations(r["dialogue_id"], lang, facts.problem, facts.situation)
        if similar:
            f = Facts(**{**facts.__dict__, "situation": rng.choice(similar)})
            cands["similar_problem"] = render({**_steps(f, lang, taxonomy, cfg, phr), "response": gold})
        if fam is None:  # an emotion the tables do not know: only a positive one is surely wrong
            wrong = list(cfg.positive)
        elif fam == "positive":
            wrong = [e for es in cfg.families.values() for e in es]
        else:
            wrong = [e for f2, es in cfg.families.items() if f2 != fam for e in es] + list(cfg.positive)
        en, zh = rng.choice(wrong)
        sentiment = "positive" if (en, zh) in cfg.positive else "negative"
        f = Facts(**{**facts.__dict__, "emotion": zh if lang == "zh" else en, "sentiment": sentiment})
        cands["wrong_emotion"] = render({**_steps(f, lang, taxonomy, cfg, phr), "response": gold})
        f = Facts(**{**facts.__dict__, "strategy": rng.choice([n for n in taxonomy.names if n != facts.strategy])})
        cands["unused_strategy"] = render({**_steps(f, lang, taxonomy, cfg, phr), "response": gold})
        others = pools.other_rounds(r["dialogue_id"], r["round_index"], gold, cfg.min_round_distance)
        picked = rng.sample(others, min(2, len(others)))
        if picked:
            cands["other_round"] = render({**steps, "response": picked[0].text})
        dialogues_pool = pools.other_dialogue_replies(r["dialogue_id"], lang, r.get("meta", {}).get("problem_type"))
        if dialogues_pool:
            cands["other_dialogue"] = render({**steps, "response": rng.choice(dialogues_pool).text})
        made: dict[str, dict[str, Any]] = {}
        off_stage = [n for n in taxonomy.names
                     if n != facts.strategy and cfg.strategy_stage.get(n, facts.stage) != facts.stage]
        if off_stage:
            f = Facts(**{**facts.__dict__, "strategy": rng.choice(off_stage)})
            cands["stage_mismatch"] = render({**_steps(f, lang, taxonomy, cfg, phr), "response": gold})
            made["stage_mismatch"] = {"kind": "stage_mismatch", "source": "rule", "rule": "strategy_of_another_stage",
                                      "strategy": f.strategy, "stage": facts.stage}
        for kind in HACK_KINDS:
            for neg in (hacks.rule_made(kind, r, facts.stage, rng), hacks.policy_made(kind, r, rng)):
                if neg is not None:
                    cands[neg.kind] = render({**steps, "response": neg.text})
                    made[neg.kind] = neg.meta()
                    if neg.source == "policy":
                        counts[f"{neg.kind}_on_its_own_prompt"] += bool(neg.origin["same_prompt"])
        # last, so that the group's other candidates do not depend on the policy's file
        if misfit := hacks.misfit(r, rng):
            f = Facts(**{**facts.__dict__, "strategy": misfit.origin.get("strategy") or facts.strategy})
            cands[misfit.kind] = render({**_steps(f, lang, taxonomy, cfg, phr), "response": misfit.text})
            made[misfit.kind] = misfit.meta()
        for kind in NEGATIVE_KINDS:
            counts[f"built_{kind}" if kind in cands else f"missing_{kind}"] += 1
        groups.append({"record": CONTRAST_GROUP, "dialogue_id": r["dialogue_id"], "round_index": r["round_index"],
                       "lang": lang, "history": r["history"], "strategy": facts.strategy,
                       "references": {"gold": gold, "other_round": picked[1].text if len(picked) > 1 else None},
                       "candidates": cands, "negatives": made})
    counts["groups"] = len(groups)
    counts["groups_with_other_round_reference"] = sum(1 for g in groups if g["references"]["other_round"])
    return groups, counts


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``compeer-data contrast``."""
    p = sub.add_parser("contrast", help="reward-AUC groups: a real turn vs one candidate per kind of negative",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common(p)
    p.add_argument("--dialogues", action="append", default=[],
                   help="dialogue records (ingest output) whose rounds supply the reply pools (repeatable)")
    p.add_argument("--taxonomy", default=None, help="strategy taxonomy YAML")
    p.add_argument("--config", default=None, help="silver construction YAML (default: packaged silver.yaml)")
    p.add_argument("--pool", choices=REPLY_POOLS, default="eval",
                   help="rule-made hack texts: eval (default: groups of an evaluation split) or train")
    p.add_argument("--policy-negatives", action="append", default=[], metavar="FILE",
                   help="policy-made negative replies (compeer-data policy-negatives output; repeatable): adds the "
                        "policy_* kinds")
    p.set_defaults(run=run)


def run(args: argparse.Namespace, argv: list[str] | None = None, **_: Any) -> int:
    """Execute the contrast stage."""
    st = StageRun("contrast", args.out, argv, list(args.inputs) + list(args.dialogues) + list(args.policy_negatives),
                  params={"seed": args.seed, "limit": args.limit, "pool": args.pool,
                          "policy_negatives": args.policy_negatives})
    rounds = limited(read_records([Path(p) for p in args.inputs], (ROUND,)), args.limit)
    dialogues = read_records([Path(p) for p in args.dialogues], (DIALOGUE,)) if args.dialogues else None
    policy = PolicyPool.load(args.policy_negatives) if args.policy_negatives else None
    groups, counts = build_contrast(rounds, load_taxonomy(args.taxonomy), load_config(args.config), args.seed,
                                    dialogues, args.pool, policy)
    write_jsonl(st.path("groups.jsonl"), groups)
    st.counts = {k: counts[k] for k in sorted(counts)}
    st.finish(quiet=args.quiet)
    return 0
