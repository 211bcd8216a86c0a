"""Stage 5, silver: judge items labelled by construction from a strategy-annotated corpus (no annotators).

Input: ``round`` records (stage 3) whose dialogue has gold metadata, and optionally (``--dialogues``) the dialogue
records they came from, whose every round supplies the pools of replies below (without them, only the sampled
rounds do). For each round the *true* steps are written from the gold data, each in one of several phrasings
(``data/silver.yaml``; :mod:`data_builder.silver_text`):

- step 1 (analysis): ``problem_type`` and ``situation`` -> the core issue; the support stage from the gold strategy
  (Question / Restatement -> exploration; Reflection / Self-disclosure / Affirmation -> comforting; Suggestions /
  Information -> action; Others -> by position in the dialogue);
- step 2 (emotion): ``emotion_type`` -> emotion and sentiment; intensity interpolated between the survey's initial
  and final emotion intensity by the round's position (omitted when the survey has neither);
- step 3 (strategy): the gold strategy of the reference reply with its taxonomy description.

Then, of every step's slots, ``round(false_share * slots)`` are corrupted (seeded), each in a way a careless
supporter would really get it wrong (weights in the config's ``negatives``): step 1 gets the situation of another
dialogue with the *same* problem type, another problem type, or a wrong stage; step 2 an emotion of another family
or a positive one; step 3 a strategy the reply does not carry out (for the real reply: one the annotators did not
use at this turn), or, beside the round's own strategy, one of another support stage (``stage_mismatch``).

The candidate's reply and the reference (shown first) come from one preference pair (``preference`` weights):
the real reply against the reply of another round of the same dialogue (at least ``min_round_distance`` rounds
away), against a reply of another dialogue with the same problem type, or against a *hack* (a reply a policy writes
to game the judge: :mod:`data_builder.negatives`, from the ``--pool`` of texts and ``--policy-negatives``), either
way round (``first`` / ``second``); two replies that both belong elsewhere, or one and a hack (``neither``); the real
reply and its continuation (the next turn of the same supporter block) or the real reply repeated (``both_good``).
Step 3 is judged beside the reply (template ``unifireward-v2``): a true step 3 names the strategy the candidate's
reply is annotated with (for the real reply, the gold strategy), so a strategy/reply mismatch is what makes it False;
a hack carries out no strategy, so beside a candidate hack step 3 is False (``no_strategy``; those slots are not
among the drawn ones); whether the reply fits the moment is the preference round's question. A round whose own
prompt has a policy-made ``misfit`` reply (a strategy of another support stage, ``--stage-misfit`` of
``policy-negatives``) pairs the real reply against it with probability ``misfit_share``; beside it as the candidate,
step 3 names the strategy the policy named and is False (``stage_mismatch``).

Each round also gives two items for mode ``reply`` (candidate ``<response>...</response>`` only) on the same
conversation: the real reply (True) and one from another round or dialogue or a hack (False), by the config's
``reply`` weights, so the judge learns from the reply, not from the conversation. Every item names its negative
reply (``negative``; ``construction.negative``: kind, source rule/policy/corpus, rule, where from). Silver labels are
noisy by nature (another strategy can also be fine); the paper's human labels are the reference for evaluation.
"""

from __future__ import annotations

import argparse
import random
from collections import Counter
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from cer.reasoning import render
from cer.taxonomy import Taxonomy, load_taxonomy
from data_builder.negatives import POLICY_MISFIT, HackMaker, Negative, PolicyPool
from data_builder.pools import Pools, Reply, build_pools
from data_builder.records import DIALOGUE, JUDGE_ITEM, ROUND, Record, read_records, write_jsonl
from data_builder.silver_text import (
    RATIONALE_FIELDS,
    REPLY_POOLS,
    Facts,
    RationaleFields,
    SilverConfig,
    load_config,
    pick,
    rationale,
    render_steps,
    with_rationales,
)
from data_builder.stage import StageRun, add_common, limited, progress, stable_seed

SOURCE_OF_ORIGIN = {"original": "silver", "persona": "persona", "rewrite": "rewrite"}
PREFERENCE_OF = {"gold_vs_other_round": "first", "other_round_vs_gold": "second", "gold_vs_other_dialogue": "first",
                 "other_dialogue_vs_gold": "second", "off_vs_off": "neither", "gold_vs_hack": "first",
                 "hack_vs_gold": "second", "off_vs_hack": "neither", "continuation": "both_good",
                 "identical": "both_good"}
#: the pairs whose candidate reply is a hack: it carries out no strategy, so the candidate's step 3 is False
HACK_CANDIDATE = frozenset({"gold_vs_hack", "off_vs_hack"})


@dataclass(frozen=True)
class Pair:
    """One preference pair: the reference (shown first), the candidate's reply, and the negative among them."""

    kind: str
    reference: str
    reference_source: str | None
    reply: Reply
    negative: Negative | None = None
    negative_role: str | None = None  # "candidate" | "reference"


def support_stage(strategy: str, round_index: int, num_rounds: int, cfg: SilverConfig) -> str:
    """The stage a gold strategy implies; for strategies without one, the stage of the round's position."""
    if strategy in cfg.strategy_stage:
        return cfg.strategy_stage[strategy]
    pos = (round_index - 1) / max(1, num_rounds - 1) if num_rounds > 1 else 0.0
    return "exploration" if pos < 1 / 3 else "comforting" if pos < 2 / 3 else "action"


def round_intensity(meta: dict[str, Any], round_index: int, num_rounds: int) -> int | None:
    """Survey intensity at this round: initial → final, linearly by position; None when neither was rated."""
    a, b = meta.get("initial_intensity"), meta.get("final_intensity")
    if a is None:
        return None if b is None else int(b)
    if b is None:
        return int(a)
    pos = (round_index - 1) / (num_rounds - 1) if num_rounds > 1 else 0.0
    return round(int(a) + (int(b) - int(a)) * pos)


def true_facts(r: Record, taxonomy: Taxonomy, cfg: SilverConfig) -> tuple[Facts | None, str | None, str]:
    """``(facts, emotion family, "")`` of a round from its gold data, or ``(None, None, skip reason)``."""
    meta = r.get("meta", {})
    strategy = r.get("strategy")
    emotion = str(meta.get("emotion_type", "")).strip()
    if not strategy or taxonomy.normalise(strategy) is None:
        return None, None, "skipped_no_strategy"
    if not emotion:
        return None, None, "skipped_no_emotion"
    problem = str(meta.get("problem_type") or "").strip()
    situation = " ".join(str(meta.get("situation") or "").split())
    if not problem and not situation:
        return None, None, "skipped_no_problem"
    fam, _ = cfg.emotion_entry(emotion)
    return Facts(problem=problem or situation, situation=situation if problem else "",
                 stage=support_stage(strategy, r["round_index"], r["num_rounds"], cfg),
                 sentiment="positive" if fam == "positive" else "negative", emotion=emotion,
                 intensity=round_intensity(meta, r["round_index"], r["num_rounds"]), strategy=strategy), fam, ""


def gold_rounds(rounds: Iterable[Record], taxonomy: Taxonomy, cfg: SilverConfig, dialogues: list[Record] | None,
                counts: Counter[str]) -> tuple[list[tuple[Record, Facts, str | None]], Pools]:
    """The rounds with gold facts (others counted by skip reason in ``counts``) and the reply pools."""
    usable: list[tuple[Record, Facts, str | None]] = []
    for r in rounds:
        counts["rounds"] += 1
        facts, fam, skip = true_facts(r, taxonomy, cfg)
        if facts is None:
            counts[skip] += 1
        else:
            usable.append((r, facts, fam))
    return usable, build_pools([r for r, _, _ in usable], dialogues or [])


def corrupt_step(step: str, facts: Facts, shown: Facts, fam: str | None, r: Record, pools: Pools, taxonomy: Taxonomy,
                 cfg: SilverConfig, rng: random.Random) -> str | None:
    """Make ``shown``'s ``step`` wrong in a kind drawn from the config; returns the kind (None: none possible)."""
    lang = r.get("lang", "en")
    if step == "step1":
        similar = pools.similar_situations(r["dialogue_id"], lang, facts.problem, facts.situation)
        others = [p for p in pools.problems(lang) if p != facts.problem]
        kind = pick(cfg.negatives["step1"], {"wrong_stage"} | ({"similar_problem"} if similar else set())
                    | ({"other_problem"} if others else set()), rng)
        if kind == "similar_problem":
            shown.situation = rng.choice(similar)
        elif kind == "other_problem":
            shown.problem, shown.situation = rng.choice(others), ""
        elif kind == "wrong_stage":
            shown.stage = rng.choice([s for s in taxonomy.stages if s != facts.stage])
        return kind
    if step == "step2":
        allowed = {"positive"} if fam != "positive" else set()
        if fam is not None:
            allowed.add("other_family")
        kind = pick(cfg.negatives["step2"], allowed, rng)
        if kind == "other_family":
            choices = [e for f2, es in cfg.families.items() if f2 != fam for e in es]
            shown.sentiment = "negative"
        elif kind == "positive":
            choices, shown.sentiment = list(cfg.positive), "positive"
        else:
            return None
        en, zh = rng.choice(choices)
        shown.emotion = zh if lang == "zh" else en
        return kind
    # stage_mismatch only beside the round's own strategy (which fits its stage by construction)
    off_stage = [n for n in taxonomy.names if n != shown.strategy and cfg.strategy_stage.get(n, facts.stage) != facts.stage]
    kind = pick(cfg.negatives["step3"], {"unused_strategy"} | (
        {"stage_mismatch"} if off_stage and shown.strategy == facts.strategy else set()), rng)
    if kind is None:
        return None
    shown.strategy = rng.choice(off_stage if kind == "stage_mismatch" else
                                [n for n in taxonomy.names if n != shown.strategy])
    return kind


def _corpus(kind: str, reply: Reply) -> Negative:
    return Negative(kind, reply.text, "corpus", "corpus", {"dialogue_id": reply.dialogue_id,
                                                           "round_index": reply.round_index})


def preference_pair(r: Record, stage: str, pools: Pools, hacks: HackMaker, cfg: SilverConfig,
                    rng: random.Random) -> Pair:
    """One preference pair for round ``r`` (see the module doc), drawn by the config's ``preference`` weights among
    the kinds that can be built for it."""
    gold = Reply(r["dialogue_id"], r["round_index"], r["reference"], r.get("strategy"))
    rounds = pools.other_rounds(r["dialogue_id"], r["round_index"], gold.text, cfg.min_round_distance)
    dialogues = pools.other_dialogue_replies(r["dialogue_id"], r.get("lang", "en"), r.get("meta", {}).get("problem_type"))
    cont = pools.continuation.get((r["dialogue_id"], r["round_index"]))
    off = [("other_round", x) for x in rounds] + [("other_dialogue", x) for x in dialogues]
    allowed = {"identical", "gold_vs_hack", "hack_vs_gold"} | ({"off_vs_hack"} if off else set()) \
        | ({"gold_vs_other_round", "other_round_vs_gold"} if rounds else set()) \
        | ({"gold_vs_other_dialogue", "other_dialogue_vs_gold"} if dialogues else set()) \
        | ({"off_vs_off"} if len(off) >= 2 else set()) | ({"continuation"} if cont else set())
    if misfit := hacks.misfit(r, rng, cfg.misfit_share):
        # the policy's reply of another stage's strategy, shown with the strategy it names, against the real reply
        kind = pick(cfg.preference, {"gold_vs_hack", "hack_vs_gold"}, rng) or "gold_vs_hack"
        named = Reply(r["dialogue_id"], r["round_index"], misfit.text, misfit.origin.get("strategy"))
        return (Pair(kind, gold.text, "gold", named, misfit, "candidate") if kind == "gold_vs_hack" else
                Pair(kind, misfit.text, "hack", gold, misfit, "reference"))
    kind = pick(cfg.preference, allowed, rng) or "identical"
    if "hack" in kind:
        hack = hacks.draw(r, stage, rng)
        if hack is None:  # no kind of hack can be built for this round: draw among the others
            kind = pick(cfg.preference, {k for k in allowed if "hack" not in k}, rng) or "identical"
        else:
            as_reply = Reply(r["dialogue_id"], r["round_index"], hack.text, None)
            if kind == "gold_vs_hack":
                return Pair(kind, gold.text, "gold", as_reply, hack, "candidate")
            if kind == "hack_vs_gold":
                return Pair(kind, hack.text, "hack", gold, hack, "reference")
            _, ref = rng.choice(off)
            return Pair(kind, ref.text, "off", as_reply, hack, "candidate")
    if kind in ("gold_vs_other_round", "gold_vs_other_dialogue"):
        source = kind.removeprefix("gold_vs_")
        other = rng.choice(rounds if source == "other_round" else dialogues)
        return Pair(kind, gold.text, "gold", other, _corpus(source, other), "candidate")
    if kind in ("other_round_vs_gold", "other_dialogue_vs_gold"):
        source = kind.removesuffix("_vs_gold")
        other = rng.choice(rounds if source == "other_round" else dialogues)
        return Pair(kind, other.text, source, gold, _corpus(source, other), "reference")
    if kind == "off_vs_off":
        (_, a), (source, b) = rng.sample(off, 2)
        return Pair(kind, a.text, "off", b, _corpus(source, b), "candidate")
    if kind == "continuation":
        assert cont is not None
        return (Pair(kind, gold.text, "gold", cont) if rng.random() < 0.5 else
                Pair(kind, cont.text, "continuation", gold))
    return Pair(kind, gold.text, "gold", gold)


def build_silver(rounds: list[Record], taxonomy: Taxonomy, cfg: SilverConfig, false_share: float = 0.25, seed: int = 0,
                 dialogues: list[Record] | None = None, reply_items: bool = True, pool: str = "train",
                 policy: PolicyPool | None = None) -> tuple[list[Record], Counter[str]]:
    """Silver judge items from round records (see the module docstring for the rules); returns items and counts.

    ``pool``: which rule-made hack texts to use (``train`` for a training split, ``eval`` for an evaluation split);
    ``policy``: policy-made negative replies, used by :class:`data_builder.negatives.HackMaker`'s split rules.
    """
    if not 0.0 <= false_share <= 1.0:
        raise ValueError("false_share must be within [0, 1]")
    if pool not in REPLY_POOLS:
        raise ValueError(f"pool {pool!r}: expected one of {', '.join(REPLY_POOLS)}")
    counts: Counter[str] = Counter()
    usable, pools = gold_rounds(progress(rounds, "silver"), taxonomy, cfg, dialogues, counts)
    hacks = HackMaker(cfg, taxonomy, pool, policy)
    drawn: list[tuple[random.Random, Pair]] = []
    for r, facts, _ in usable:
        rng = random.Random(stable_seed("silver-item", seed, r["dialogue_id"], r["round_index"]))
        drawn.append((rng, preference_pair(r, facts.stage, pools, hacks, cfg, rng)))
    # a hack's step 3 is False by construction (a policy's misfit: its strategy does not fit the stage); of every
    # step's other slots, a false_share is corrupted
    forced = {(i, 2): "stage_mismatch" if pair.negative and pair.negative.kind == POLICY_MISFIT else "no_strategy"
              for i, (_, pair) in enumerate(drawn) if pair.kind in HACK_CANDIDATE}
    corrupt: set[tuple[int, int]] = set()
    for k in range(3):
        slots = [(i, k) for i in range(len(usable)) if (i, k) not in forced]
        random.Random(stable_seed("silver", seed, k)).shuffle(slots)
        corrupt |= set(slots[: round(false_share * len(slots))])
    items: list[Record] = []
    for i, ((r, facts, fam), (rng, pair)) in enumerate(zip(usable, drawn)):
        lang = r.get("lang", "en")
        # step 3 names the strategy the candidate's reply carries out (its annotation), unless corrupted
        reply_strategy = taxonomy.normalise(pair.reply.strategy) if pair.reply.strategy else None
        shown = Facts(**{**facts.__dict__, "strategy": reply_strategy or facts.strategy})
        corrupted: dict[str, str] = {"step3": forced[(i, 2)]} if (i, 2) in forced else {}
        for k, step in enumerate(("step1", "step2", "step3")):
            if (i, k) in corrupt and (kind := corrupt_step(step, facts, shown, fam, r, pools, taxonomy, cfg, rng)):
                corrupted[step] = kind
        fields = asdict(RationaleFields.of(facts, shown, reply_strategy or facts.strategy))
        labels: dict[str, Any] = {"step1": "step1" not in corrupted, "step2": "step2" not in corrupted,
                                  "step3": "step3" not in corrupted, "preference": PREFERENCE_OF[pair.kind]}
        step3 = corrupted.get("step3")
        rationales = {
            "step1": rationale(cfg, f"step1_{corrupted['step1']}" if "step1" in corrupted else "step1_true", rng,
                               **fields),
            "step2": rationale(cfg, "step2_wrong" if "step2" in corrupted else "step2_true", rng, **fields),
            "step3": rationale(cfg, "step3_true" if step3 is None else "step3_wrong" if step3 == "unused_strategy"
                               else f"step3_{step3}", rng, **fields),
            "preference": rationale(cfg, f"preference_{labels['preference']}", rng, **fields),
        }
        if reply_strategy and reply_strategy != facts.strategy:
            counts["step3_names_another_rounds_strategy"] += 1
        candidate = render({**render_steps(shown, lang, taxonomy, cfg, rng), "response": pair.reply.text})
        counts[f"pair_{pair.kind}"] += 1
        for step, kind in corrupted.items():
            counts[f"corrupted_{step}_{kind}"] += 1
        base = {"record": JUDGE_ITEM, "dialogue_id": r["dialogue_id"], "round_index": r["round_index"], "lang": lang,
                "history": r["history"], "source": SOURCE_OF_ORIGIN.get(r.get("origin", "original"), "silver")}
        neg = pair.negative
        if neg is not None:
            counts[f"negative_{neg.kind}"] += 1
        items.append({**base, "item_id": f"{r['dialogue_id']}/r{r['round_index']}/silver", "reference": pair.reference,
                      "candidate": candidate, "labels": labels, "rationales": rationales,
                      "negative": neg.kind if neg else None,
                      "construction": {"pair": pair.kind, "reference_source": pair.reference_source,
                                       "corrupted": corrupted, "reply_strategy": pair.reply.strategy,
                                       "negative": {**neg.meta(), "role": pair.negative_role} if neg else None}})
        if reply_items:
            items.extend({**base, **it} for it in reply_items_of(r, facts.stage, pools, hacks, cfg, rng, counts))
    counts["items"] = len(items)
    counts["step3_false_beside_a_hack"] = len(forced)
    return items, counts


def reply_items_of(r: Record, stage: str, pools: Pools, hacks: HackMaker, cfg: SilverConfig, rng: random.Random,
                   counts: Counter[str]) -> list[Record]:
    """The mode-``reply`` items of a round, on the same conversation: the real reply (True) and one that belongs
    elsewhere or is a hack (False: by the config's ``reply`` weights)."""
    rounds = pools.other_rounds(r["dialogue_id"], r["round_index"], r["reference"], cfg.min_round_distance)
    dialogues = pools.other_dialogue_replies(r["dialogue_id"], r.get("lang", "en"), r.get("meta", {}).get("problem_type"))
    kind = pick(cfg.reply, {"hack"} | ({"other_round"} if rounds else set()) | ({"other_dialogue"} if dialogues else set()),
                rng)
    neg: Negative | None = None
    if kind == "hack":
        neg = hacks.draw(r, stage, rng)
    elif kind is not None:
        neg = _corpus(kind, rng.choice(rounds if kind == "other_round" else dialogues))
    out: list[tuple[str, Negative | None]] = [(r["reference"], None)] + ([(neg.text, neg)] if neg else [])
    items = []
    for text, n in out:
        counts[f"reply_{n.kind if n else 'gold'}"] += 1
        items.append({"item_id": f"{r['dialogue_id']}/r{r['round_index']}/reply-{'neg' if n else 'pos'}",
                      "reference": None, "candidate": f"<response>{text}</response>", "labels": {"reply": n is None},
                      "rationales": {"reply": rationale(cfg, "reply_false" if n else "reply_true", rng)},
                      "negative": n.kind if n else None,
                      "construction": {"reply": n.kind if n else "gold", "negative": n.meta() if n else None}})
    return items


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``compeer-data silver``."""
    p = sub.add_parser("silver", help="labels by construction from gold metadata", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common(p)
    p.add_argument("--false-share", type=float, default=0.25,
                   help="share of each step's slots corrupted (default 0.25); step 3 beside a hack is False besides")
    p.add_argument("--dialogues", action="append", default=[],
                   help="dialogue records (ingest output) whose rounds supply the reply pools (repeatable)")
    p.add_argument("--no-reply-items", action="store_true", help="skip the mode-reply items")
    p.add_argument("--pool", choices=REPLY_POOLS, default="train",
                   help="rule-made hack texts: train (for a training split, default) or eval (for an evaluation split); "
                        "the two pools share no text")
    p.add_argument("--policy-negatives", action="append", default=[], metavar="FILE",
                   help="policy-made negative replies (compeer-data policy-negatives output; repeatable)")
    p.add_argument("--taxonomy", default=None, help="strategy taxonomy YAML")
    p.add_argument("--config", default=None, help="silver construction YAML (default: packaged silver.yaml)")
    p.add_argument("--rationales", default=None, metavar="FILE",
                   help="YAML mapping of rationale keys to phrasings that replace the config's (e.g. "
                        "data_builder/data/rationales-step3-evidence.yaml); fields: " + ", ".join(RATIONALE_FIELDS))
    p.set_defaults(run=run)


def run(args: argparse.Namespace, argv: list[str] | None = None, **_: Any) -> int:
    """Execute the silver stage."""
    st = StageRun("silver", args.out, argv, list(args.inputs) + list(args.dialogues) + list(args.policy_negatives),
                  params={"false_share": args.false_share, "seed": args.seed, "limit": args.limit,
                          "reply_items": not args.no_reply_items, "pool": args.pool,
                          "policy_negatives": args.policy_negatives, "rationales": args.rationales})
    rounds = limited(read_records([Path(p) for p in args.inputs], (ROUND,)), args.limit)
    dialogues = read_records([Path(p) for p in args.dialogues], (DIALOGUE,)) if args.dialogues else None
    policy = PolicyPool.load(args.policy_negatives) if args.policy_negatives else None
    cfg = load_config(args.config)
    if args.rationales:
        cfg = with_rationales(cfg, args.rationales)
    items, counts = build_silver(rounds, load_taxonomy(args.taxonomy), cfg, args.false_share,
                                 args.seed, dialogues, not args.no_reply_items, args.pool, policy)
    write_jsonl(st.path("items.jsonl"), items)
    steps = [it for it in items if "step1" in it["labels"]]
    n_steps = 3 * len(steps)
    n_false = sum(1 for it in steps for s in ("step1", "step2", "step3") if not it["labels"][s])
    prefs = Counter(it["labels"]["preference"] for it in steps)
    st.counts = {**{k: counts[k] for k in sorted(counts)}, "step_labels": n_steps, "step_false": n_false,
                 "false_share": n_false / n_steps if n_steps else 0.0,
                 "false_by_step": {s: sum(not it["labels"][s] for it in steps) for s in ("step1", "step2", "step3")},
                 "preferences": dict(sorted(prefs.items()))}
    st.finish(quiet=args.quiet)
    return 0
