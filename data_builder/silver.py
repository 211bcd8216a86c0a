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

Then exactly ``round(false_share * 3 * items)`` step slots are corrupted (seeded), each in a way a careless
supporter would really get it wrong (weights in the config's ``negatives``): step 1 gets the situation of another
dialogue with the *same* problem type, another problem type, or a wrong stage; step 2 an emotion of another family
or a positive one; step 3 a strategy the reply does not carry out (for the real reply: one the annotators did not
use at this turn).

The candidate's reply and the reference (shown first) come from one preference pair (``preference`` weights):
the real reply against the reply of another round of the same dialogue (at least ``min_round_distance`` rounds
away) or against a reply of another dialogue with the same problem type, either way round (``first`` /
``second``); two replies that both belong elsewhere (``neither``); the real reply and its continuation (the next
turn of the same supporter block) or the real reply repeated (``both_good``). Step 3 is judged beside the reply
(template ``unifireward-v2``): a true step 3 names the strategy the candidate's reply is annotated with (for the real
reply, the gold strategy), so a strategy/reply mismatch is what makes it False; whether the reply fits the moment is
the preference round's question.

Each round also gives two items for mode ``reply`` (candidate ``<response>...</response>`` only) on the same
conversation: the real reply (True) and one from another round or dialogue (False), by the config's ``reply``
weights, so the judge learns from the reply, not from the conversation. Silver labels are noisy by
nature (another strategy can also be fine); the paper's human labels are the reference for evaluation.
"""

from __future__ import annotations

import argparse
import random
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from cer.reasoning import render
from cer.taxonomy import Taxonomy, load_taxonomy
from data_builder.pools import Pools, Reply, build_pools
from data_builder.records import DIALOGUE, JUDGE_ITEM, ROUND, Record, read_records, write_jsonl
from data_builder.silver_text import Facts, SilverConfig, load_config, pick, rationale, render_steps
from data_builder.stage import StageRun, add_common, limited, progress, stable_seed

SOURCE_OF_ORIGIN = {"original": "silver", "persona": "persona", "rewrite": "rewrite"}
PREFERENCE_OF = {"gold_vs_other_round": "first", "other_round_vs_gold": "second", "gold_vs_other_dialogue": "first",
                 "other_dialogue_vs_gold": "second", "off_vs_off": "neither", "continuation": "both_good",
                 "identical": "both_good"}


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
    shown.strategy = rng.choice([n for n in taxonomy.names if n != shown.strategy])
    return pick(cfg.negatives["step3"], {"unused_strategy"}, rng)


def preference_pair(r: Record, pools: Pools, cfg: SilverConfig,
                    rng: random.Random) -> tuple[str, str | None, Reply, str]:
    """``(reference, reference source, candidate reply, kind)`` of one preference pair (see the module doc)."""
    gold = Reply(r["dialogue_id"], r["round_index"], r["reference"], r.get("strategy"))
    rounds = pools.other_rounds(r["dialogue_id"], r["round_index"], gold.text, cfg.min_round_distance)
    dialogues = pools.other_dialogue_replies(r["dialogue_id"], r.get("lang", "en"), r.get("meta", {}).get("problem_type"))
    cont = pools.continuation.get((r["dialogue_id"], r["round_index"]))
    allowed = {"identical"} | ({"gold_vs_other_round", "other_round_vs_gold"} if rounds else set()) \
        | ({"gold_vs_other_dialogue", "other_dialogue_vs_gold"} if dialogues else set()) \
        | ({"off_vs_off"} if len(rounds) + len(dialogues) >= 2 else set()) | ({"continuation"} if cont else set())
    kind = pick(cfg.preference, allowed, rng) or "identical"
    if kind == "gold_vs_other_round":
        return gold.text, "gold", rng.choice(rounds), kind
    if kind == "other_round_vs_gold":
        return rng.choice(rounds).text, "other_round", gold, kind
    if kind == "gold_vs_other_dialogue":
        return gold.text, "gold", rng.choice(dialogues), kind
    if kind == "other_dialogue_vs_gold":
        return rng.choice(dialogues).text, "other_dialogue", gold, kind
    if kind == "off_vs_off":
        a, b = rng.sample(rounds + dialogues, 2)
        return a.text, "off", b, kind
    if kind == "continuation":
        assert cont is not None
        return (gold.text, "gold", cont, kind) if rng.random() < 0.5 else (cont.text, "continuation", gold, kind)
    return gold.text, "gold", gold, kind


def build_silver(rounds: list[Record], taxonomy: Taxonomy, cfg: SilverConfig, false_share: float = 0.25, seed: int = 0,
                 dialogues: list[Record] | None = None, reply_items: bool = True) -> tuple[list[Record], Counter[str]]:
    """Silver judge items from round records (see the module docstring for the rules); returns items and counts."""
    if not 0.0 <= false_share <= 1.0:
        raise ValueError("false_share must be within [0, 1]")
    counts: Counter[str] = Counter()
    usable, pools = gold_rounds(progress(rounds, "silver"), taxonomy, cfg, dialogues, counts)
    slots = [(i, s) for i in range(len(usable)) for s in range(3)]
    random.Random(stable_seed("silver", seed)).shuffle(slots)
    corrupt = set(slots[: round(false_share * len(slots))])
    items: list[Record] = []
    for i, (r, facts, fam) in enumerate(usable):
        rng = random.Random(stable_seed("silver-item", seed, r["dialogue_id"], r["round_index"]))
        lang = r.get("lang", "en")
        reference, ref_source, reply, pair = preference_pair(r, pools, cfg, rng)
        # step 3 names the strategy the candidate's reply carries out (its annotation), unless corrupted
        reply_strategy = taxonomy.normalise(reply.strategy) if reply.strategy else None
        shown = Facts(**{**facts.__dict__, "strategy": reply_strategy or facts.strategy})
        corrupted: dict[str, str] = {}
        for k, step in enumerate(("step1", "step2", "step3")):
            if (i, k) in corrupt and (kind := corrupt_step(step, facts, shown, fam, r, pools, taxonomy, cfg, rng)):
                corrupted[step] = kind
        fields = {"problem": facts.problem, "stage": shown.stage, "gold_stage": facts.stage, "emotion": shown.emotion,
                  "gold_emotion": facts.emotion, "strategy": shown.strategy,
                  "reply_strategy": reply_strategy or facts.strategy}
        labels: dict[str, Any] = {"step1": "step1" not in corrupted, "step2": "step2" not in corrupted,
                                  "step3": "step3" not in corrupted, "preference": PREFERENCE_OF[pair]}
        rationales = {
            "step1": rationale(cfg, f"step1_{corrupted['step1']}" if "step1" in corrupted else "step1_true", rng,
                               **fields),
            "step2": rationale(cfg, "step2_wrong" if "step2" in corrupted else "step2_true", rng, **fields),
            "step3": rationale(cfg, "step3_wrong" if "step3" in corrupted else "step3_true", rng, **fields),
            "preference": rationale(cfg, f"preference_{labels['preference']}", rng, **fields),
        }
        if reply_strategy and reply_strategy != facts.strategy:
            counts["step3_names_another_rounds_strategy"] += 1
        candidate = render({**render_steps(shown, lang, taxonomy, cfg, rng), "response": reply.text})
        counts[f"pair_{pair}"] += 1
        for step, kind in corrupted.items():
            counts[f"corrupted_{step}_{kind}"] += 1
        base = {"record": JUDGE_ITEM, "dialogue_id": r["dialogue_id"], "round_index": r["round_index"], "lang": lang,
                "history": r["history"], "source": SOURCE_OF_ORIGIN.get(r.get("origin", "original"), "silver")}
        items.append({**base, "item_id": f"{r['dialogue_id']}/r{r['round_index']}/silver", "reference": reference,
                      "candidate": candidate, "labels": labels, "rationales": rationales,
                      "construction": {"pair": pair, "reference_source": ref_source, "corrupted": corrupted,
                                       "reply_strategy": reply.strategy}})
        if reply_items:
            items.extend({**base, **it} for it in reply_items_of(r, pools, cfg, rng, counts))
    counts["items"] = len(items)
    return items, counts


def reply_items_of(r: Record, pools: Pools, cfg: SilverConfig, rng: random.Random, counts: Counter[str]) -> list[Record]:
    """The mode-``reply`` items of a round, on the same conversation: the real reply (True) and one that belongs
    elsewhere (False: another round of the dialogue or another dialogue, by the config's ``reply`` weights)."""
    rounds = pools.other_rounds(r["dialogue_id"], r["round_index"], r["reference"], cfg.min_round_distance)
    dialogues = pools.other_dialogue_replies(r["dialogue_id"], r.get("lang", "en"), r.get("meta", {}).get("problem_type"))
    kind = pick(cfg.reply, ({"other_round"} if rounds else set()) | ({"other_dialogue"} if dialogues else set()), rng)
    out = [("gold", r["reference"])]
    if kind is not None:
        out.append((kind, rng.choice(rounds if kind == "other_round" else dialogues).text))
    items = []
    for k, text in out:
        counts[f"reply_{k}"] += 1
        ok = k == "gold"
        items.append({"item_id": f"{r['dialogue_id']}/r{r['round_index']}/reply-{'pos' if ok else 'neg'}",
                      "reference": None, "candidate": f"<response>{text}</response>", "labels": {"reply": ok},
                      "rationales": {"reply": rationale(cfg, "reply_true" if ok else "reply_false", rng)},
                      "construction": {"reply": k}})
    return items


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``compeer-data silver``."""
    p = sub.add_parser("silver", help="labels by construction from gold metadata", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common(p)
    p.add_argument("--false-share", type=float, default=0.25, help="share of step slots corrupted (default 0.25)")
    p.add_argument("--dialogues", action="append", default=[],
                   help="dialogue records (ingest output) whose rounds supply the reply pools (repeatable)")
    p.add_argument("--no-reply-items", action="store_true", help="skip the mode-reply items")
    p.add_argument("--taxonomy", default=None, help="strategy taxonomy YAML")
    p.add_argument("--config", default=None, help="silver construction YAML (default: packaged silver.yaml)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace, argv: list[str] | None = None, **_: Any) -> int:
    """Execute the silver stage."""
    st = StageRun("silver", args.out, argv, list(args.inputs) + list(args.dialogues),
                  params={"false_share": args.false_share, "seed": args.seed, "limit": args.limit,
                          "reply_items": not args.no_reply_items})
    rounds = limited(read_records([Path(p) for p in args.inputs], (ROUND,)), args.limit)
    dialogues = read_records([Path(p) for p in args.dialogues], (DIALOGUE,)) if args.dialogues else None
    items, counts = build_silver(rounds, load_taxonomy(args.taxonomy), load_config(args.config), args.false_share,
                                 args.seed, dialogues, not args.no_reply_items)
    write_jsonl(st.path("items.jsonl"), items)
    steps = [it for it in items if "step1" in it["labels"]]
    n_steps = 3 * len(steps)
    n_false = sum(1 for it in steps for s in ("step1", "step2", "step3") if not it["labels"][s])
    prefs = Counter(it["labels"]["preference"] for it in steps)
    st.counts = {**{k: counts[k] for k in sorted(counts)}, "step_labels": n_steps, "step_false": n_false,
                 "false_share": n_false / n_steps if n_steps else 0.0, "preferences": dict(sorted(prefs.items()))}
    st.finish(quiet=args.quiet)
    return 0
