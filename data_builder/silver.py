"""Stage 5, silver: judge items labelled by construction from a strategy-annotated corpus (no annotators).

Input: ``round`` records (stage 3) whose dialogue has gold metadata. For each round the *true* steps are
written from the gold data (templates in ``data_builder/data/silver.yaml``, English or Chinese by the
dialogue's language):

- step 1 (analysis): ``problem_type`` and ``situation`` → the core issue; the support stage from the gold
  strategy (ESConv's procedure: Question / Restatement → exploration; Reflection / Self-disclosure /
  Affirmation → comforting; Suggestions / Information → action; Others → by position in the dialogue);
- step 2 (emotion): ``emotion_type`` → emotion and sentiment; intensity interpolated between the survey's
  initial and final emotion intensity by the round's position (omitted when the survey has neither);
- step 3 (strategy): the gold strategy of the reference reply with its taxonomy description.

Then exactly ``round(false_share * 3 * items)`` step slots (default 23%, the paper's share) are corrupted,
chosen at random (seeded): step 1 gets another dialogue's problem (same language) or a wrong stage, step 2
an emotion of another family or a positive one (only a positive one when the corpus emotion is not in the
tables), step 3 another strategy. Corrupted steps are labelled False, the others
True; a constructed rationale says what is right or wrong.

Preference rule (the reply the judge sees first is the record's ``reference``, the candidate's ``<response>``
second). ``mismatched`` is a supporter reply drawn from another dialogue of the same language:

- ``real_first`` (share ``--pref-shares`` [0]): reference = the real reply, response = mismatched → ``first``;
- ``real_second`` ([1]): reference = mismatched, response = the real reply → ``second``;
- ``neither`` ([2]): reference and response are two different mismatched replies → ``neither``.

``both_good`` is never constructed (it needs human judgement; it comes from ``annotate``). Rounds without a
mapped gold strategy or ``emotion_type``, or without any reply from another dialogue, are skipped and counted.
Silver labels are noisy by nature (another strategy can also be fine); the paper's human labels are the
reference for evaluation.
"""

from __future__ import annotations

import argparse
import random
from collections import Counter
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from cer.reasoning import render
from cer.taxonomy import Taxonomy, load_taxonomy
from data_builder.records import JUDGE_ITEM, ROUND, Record, read_records, write_jsonl
from data_builder.stage import StageRun, add_common, limited, progress, stable_seed

SOURCE_OF_ORIGIN = {"original": "silver", "persona": "persona", "rewrite": "rewrite"}
ORIENTATIONS = ("real_first", "real_second", "neither")


@dataclass(frozen=True)
class SilverConfig:
    """The construction tables of ``silver.yaml``."""

    strategy_stage: dict[str, str]
    families: dict[str, list[tuple[str, str]]]
    positive: list[tuple[str, str]]
    templates: dict[str, dict[str, Any]]

    def emotion_entry(self, name: str) -> tuple[str | None, tuple[str, str] | None]:
        """(family, (en, zh)) of an emotion name in either language; (None, None) when unknown."""
        key = name.strip().lower()
        for fam, entries in self.families.items():
            for en, zh in entries:
                if key in (en.lower(), zh):
                    return fam, (en, zh)
        for en, zh in self.positive:
            if key in (en.lower(), zh):
                return "positive", (en, zh)
        return None, None


@lru_cache(maxsize=4)
def load_config(path: str | None = None) -> SilverConfig:
    """Load ``silver.yaml`` (the packaged one when ``path`` is None)."""
    text = (Path(path).read_text(encoding="utf-8") if path else
            resources.files("data_builder").joinpath("data/silver.yaml").read_text(encoding="utf-8"))
    data = yaml.safe_load(text)
    try:
        return SilverConfig(
            strategy_stage=dict(data["strategy_stage"]),
            families={k: [(str(e[0]), str(e[1])) for e in v] for k, v in data["emotion_families"].items()},
            positive=[(str(e[0]), str(e[1])) for e in data["positive_emotions"]],
            templates=dict(data["templates"]),
        )
    except (KeyError, TypeError, IndexError) as exc:
        raise ValueError(f"silver config {path or 'default'}: malformed ({exc})") from exc


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


@dataclass
class Facts:
    """What the steps of one round state (true or corrupted)."""

    problem: str
    situation: str
    stage: str
    sentiment: str
    emotion: str
    intensity: int | None
    strategy: str


def render_steps(f: Facts, lang: str, taxonomy: Taxonomy, cfg: SilverConfig) -> dict[str, str]:
    """The three step texts of ``f`` in ``lang`` (``en`` or ``zh``)."""
    t = cfg.templates.get(lang, cfg.templates["en"])
    desc = {s.name: s.description for s in taxonomy.strategies}.get(f.strategy, "")
    situation = t["situation"].format(situation=f.situation) if f.situation else ""
    analysis = t["analysis"].format(problem=f.problem, situation=situation, stage=t["stages"].get(f.stage, f.stage))
    sentiment = t["sentiments"].get(f.sentiment, f.sentiment)
    emotion = (t["emotion"].format(sentiment=sentiment, emotion=f.emotion, intensity=f.intensity)
               if f.intensity is not None else t["emotion_no_intensity"].format(sentiment=sentiment, emotion=f.emotion))
    strategy = t["strategy"].format(strategy=f.strategy, description=desc)
    return {"analysis": analysis, "emotion": emotion, "strategy": strategy}


def build_silver(rounds: list[Record], taxonomy: Taxonomy, cfg: SilverConfig, false_share: float = 0.23,
                 pref_shares: tuple[float, float, float] = (0.4, 0.4, 0.2), seed: int = 0) -> tuple[list[Record], Counter[str]]:
    """Silver judge items from round records (see the module docstring for the rules); returns items and counts."""
    if not 0.0 <= false_share <= 1.0:
        raise ValueError("false_share must be within [0, 1]")
    if len(pref_shares) != 3 or min(pref_shares) < 0 or sum(pref_shares) <= 0:
        raise ValueError("pref_shares: three non-negative shares (real_first, real_second, neither), not all 0")
    counts: Counter[str] = Counter()
    rng = random.Random(stable_seed("silver", seed))
    usable: list[tuple[Record, Facts, str | None]] = []
    for r in progress(rounds, "silver"):
        counts["rounds"] += 1
        meta = r.get("meta", {})
        strategy = r.get("strategy")
        emotion = str(meta.get("emotion_type", "")).strip()
        if not strategy or taxonomy.normalise(strategy) is None:
            counts["skipped_no_strategy"] += 1
            continue
        if not emotion:
            counts["skipped_no_emotion"] += 1
            continue
        fam, _ = cfg.emotion_entry(emotion)
        problem = str(meta.get("problem_type") or "").strip()
        situation = " ".join(str(meta.get("situation") or "").split())
        if not problem and not situation:
            counts["skipped_no_problem"] += 1
            continue
        facts = Facts(problem=problem or situation, situation=situation if problem else "",
                      stage=support_stage(strategy, r["round_index"], r["num_rounds"], cfg),
                      sentiment="positive" if fam == "positive" else "negative", emotion=emotion,
                      intensity=round_intensity(meta, r["round_index"], r["num_rounds"]), strategy=strategy)
        usable.append((r, facts, fam))
    # replies of other dialogues, by language, for the preference pairs
    pool: dict[str, list[tuple[str, str]]] = {}
    for r, _, _ in usable:
        pool.setdefault(r.get("lang", "en"), []).append((r["dialogue_id"], r["reference"]))
    with_pool = []
    for r, facts, fam in usable:
        if any(did != r["dialogue_id"] and ref != r["reference"] for did, ref in pool.get(r.get("lang", "en"), [])):
            with_pool.append((r, facts, fam))
        else:
            counts["skipped_no_mismatch_pool"] += 1
    usable = with_pool
    problems: dict[str, list[str]] = {}
    for r, f, _ in usable:
        problems.setdefault(r.get("lang", "en"), [])
        if f.problem not in problems[r.get("lang", "en")]:
            problems[r.get("lang", "en")].append(f.problem)
    slots = [(i, s) for i in range(len(usable)) for s in range(3)]
    rng.shuffle(slots)
    corrupt = set(slots[: round(false_share * len(slots))])
    items: list[Record] = []
    for i, (r, facts, fam) in enumerate(usable):
        lang = r.get("lang", "en")
        others = sorted({ref for did, ref in pool.get(lang, []) if did != r["dialogue_id"] and ref != r["reference"]})
        shown = Facts(**facts.__dict__)
        labels: dict[str, Any] = {}
        rationales: dict[str, str] = {}
        corrupted: dict[str, str] = {}
        # step 1
        if (i, 0) in corrupt:
            wrong_problems = sorted(p for p in problems.get(lang, []) if p != facts.problem)
            if wrong_problems and rng.random() < 0.5:
                shown.problem, shown.situation = rng.choice(wrong_problems), ""
                corrupted["step1"] = "wrong_problem"
                rationales["step1"] = "The analysis names a problem the seeker never raised in this conversation."
            else:
                shown.stage = rng.choice([s for s in taxonomy.stages if s != facts.stage])
                corrupted["step1"] = "wrong_stage"
                rationales["step1"] = (f"The issue is right but the conversation calls for the {facts.stage} stage, "
                                       f"not {shown.stage}.")
        else:
            rationales["step1"] = f"The analysis names the seeker's issue and the {facts.stage} stage, which fit."
        # step 2
        if (i, 1) in corrupt:
            if fam == "positive":
                choices = [e for es in cfg.families.values() for e in es]
                shown.sentiment = "negative"
            elif fam is None:  # an emotion the tables do not know: only a positive one is surely wrong
                choices = list(cfg.positive)
            else:
                choices = [e for f2, es in cfg.families.items() if f2 != fam for e in es] + cfg.positive
            en, zh = rng.choice(choices)
            shown.emotion = zh if lang == "zh" else en
            if (en, zh) in cfg.positive:
                shown.sentiment = "positive"
            corrupted["step2"] = "wrong_emotion"
            rationales["step2"] = f"The seeker shows {facts.emotion}, not {shown.emotion}; the emotional state is misread."
        else:
            rationales["step2"] = f"The sentiment and the emotion ({facts.emotion}) match what the seeker expresses."
        # step 3
        if (i, 2) in corrupt:
            shown.strategy = rng.choice([n for n in taxonomy.names if n != facts.strategy])
            corrupted["step3"] = "wrong_strategy"
            rationales["step3"] = f"{shown.strategy} does not fit this moment; {facts.strategy} is what the seeker needs."
        else:
            rationales["step3"] = f"{facts.strategy} fits this moment of the conversation, for the reason given."
        for k, step in enumerate(("step1", "step2", "step3")):
            labels[step] = (i, k) not in corrupt
        orientation = rng.choices(ORIENTATIONS, weights=pref_shares)[0]
        mismatched = rng.choice(others)
        if orientation == "real_first":
            reference, response, pref = r["reference"], mismatched, "first"
            rationales["preference"] = "Reply 1 answers what the seeker said; reply 2 belongs to another conversation."
        elif orientation == "real_second":
            reference, response, pref = mismatched, r["reference"], "second"
            rationales["preference"] = "Reply 2 answers what the seeker said; reply 1 belongs to another conversation."
        else:
            rest = [o for o in others if o != mismatched]
            if not rest:
                reference, response, pref, orientation = r["reference"], mismatched, "first", "real_first"
                rationales["preference"] = "Reply 1 answers what the seeker said; reply 2 belongs to another conversation."
            else:
                reference, response, pref = mismatched, rng.choice(rest), "neither"
                rationales["preference"] = "Neither reply answers this seeker; both belong to other conversations."
        labels["preference"] = pref
        steps = render_steps(shown, lang, taxonomy, cfg)
        candidate = render({**steps, "response": response})
        counts[f"orientation_{orientation}"] += 1
        for step, kind in corrupted.items():
            counts[f"corrupted_{step}_{kind}"] += 1
        items.append({
            "record": JUDGE_ITEM,
            "item_id": f"{r['dialogue_id']}/r{r['round_index']}/silver",
            "dialogue_id": r["dialogue_id"],
            "round_index": r["round_index"],
            "lang": lang,
            "history": r["history"],
            "reference": reference,
            "candidate": candidate,
            "labels": labels,
            "rationales": rationales,
            "source": SOURCE_OF_ORIGIN.get(r.get("origin", "original"), "silver"),
            "construction": {"orientation": orientation, "corrupted": corrupted},
        })
    counts["items"] = len(items)
    return items, counts


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``compeer-data silver``."""
    p = sub.add_parser("silver", help="labels by construction from gold metadata", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common(p)
    p.add_argument("--false-share", type=float, default=0.23, help="share of step labels made False (default 0.23)")
    p.add_argument("--pref-shares", type=float, nargs=3, default=(0.4, 0.4, 0.2),
                   metavar=("REAL_FIRST", "REAL_SECOND", "NEITHER"), help="preference orientation shares")
    p.add_argument("--taxonomy", default=None, help="strategy taxonomy YAML")
    p.add_argument("--config", default=None, help="silver construction YAML (default: packaged silver.yaml)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace, argv: list[str] | None = None, **_: Any) -> int:
    """Execute the silver stage."""
    st = StageRun("silver", args.out, argv, list(args.inputs),
                  params={"false_share": args.false_share, "pref_shares": list(args.pref_shares), "seed": args.seed,
                          "limit": args.limit})
    rounds = limited(read_records([Path(p) for p in args.inputs], (ROUND,)), args.limit)
    items, counts = build_silver(rounds, load_taxonomy(args.taxonomy), load_config(args.config), args.false_share,
                                 tuple(args.pref_shares), args.seed)
    write_jsonl(st.path("items.jsonl"), items)
    n_steps = 3 * len(items)
    n_false = sum(1 for it in items for s in ("step1", "step2", "step3") if not it["labels"][s])
    prefs = Counter(it["labels"]["preference"] for it in items)
    st.counts = {**{k: counts[k] for k in sorted(counts)}, "step_labels": n_steps, "step_false": n_false,
                 "false_share": n_false / n_steps if n_steps else 0.0, "preferences": dict(sorted(prefs.items()))}
    st.finish(quiet=args.quiet)
    return 0
