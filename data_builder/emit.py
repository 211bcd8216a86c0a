"""Stage 8, emit: the judge SFT sets and the GRPO prompt set as HF ``datasets`` folders.

Layout (``datasets.DatasetDict.save_to_disk``, splits ``train`` and ``heldout``):

- ``OUT/judge_sft/<mode>/`` for mode in unified, prm, orm. Columns: ``messages`` (the judge chat,
  exactly :func:`judge.protocol.render_judge_chat` of the item in that mode with its gold verdicts and
  rationales), ``dialogue_id``, ``history`` ([{role, text}]), ``reference`` (the reply the judge sees first:
  the original supporter reply, except for silver items built the other way round, see
  :mod:`data_builder.silver`), ``candidate`` (CER tagged text), ``labels`` ({step1, step2, step3: bool,
  preference: first|second|both_good|neither}), ``mode``, ``source`` (silver, annotated, persona, rewrite,
  duplicate), ``negative`` (the kind of negative reply the item holds, e.g. ``generic``, ``policy_degenerate``,
  ``other_round``: :mod:`data_builder.negatives`; null when none).
- ``OUT/grpo_prompts/``: ``dialogue_id``, ``history`` (ends with a seeker turn), ``reference`` (the original
  supporter reply), ``prompt`` (:func:`cer.policy_prompt.policy_messages` of the history).

Splits are by dialogue, never by row: a corpus dialogue and every rewrite of it (``<id>#persona``) land in the
same split, and the same dialogues are held out in the judge sets and the prompt set
(:func:`heldout_dialogues`). Python users (the reward trainer's D/R/P ablation) call
:func:`build_judge_sft`, :func:`build_grpo_prompts` and :func:`make_ablation_sets` on in-memory records.
"""

from __future__ import annotations

import argparse
import json
import random
from collections import Counter
from collections.abc import Iterable, Sequence
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cer.modes import TRAINED_MODES, JudgeMode
from cer.policy_prompt import policy_messages
from cer.reasoning import parse
from cer.taxonomy import Taxonomy, load_taxonomy
from cer.verdicts import Preference, Verdict
from data_builder.records import JUDGE_ITEM, ROUND, Record, base_dialogue_id, read_records, turns_of
from data_builder.stage import StageRun, add_common, limited, progress, stable_unit
from judge.protocol import (
    COMPONENTS,
    DEFAULT_TEMPLATE,
    PREFERENCE,
    REPLY,
    Template,
    load_template,
    mode_components,
    render_judge_chat,
)

if TYPE_CHECKING:  # datasets is imported when used: it costs ~1.5 s, and the other stages never need it
    from datasets import Dataset, DatasetDict, Features

SPLITS = ("train", "heldout")
SFT_MODES: tuple[str, ...] = tuple(m.value for m in TRAINED_MODES)


@lru_cache(maxsize=1)
def judge_features() -> Features:
    """The column types of a judge SFT split."""
    from datasets import Features, List, Value

    msg = {"role": Value("string"), "content": Value("string")}
    turn = {"role": Value("string"), "text": Value("string")}
    return Features({
        "messages": List(msg), "dialogue_id": Value("string"), "history": List(turn), "reference": Value("string"),
        "candidate": Value("string"),
        # the labels of the components the row's mode judges; the others are null
        "labels": {"step1": Value("bool"), "step2": Value("bool"), "step3": Value("bool"),
                   "preference": Value("string"), "reply": Value("bool")},
        "mode": Value("string"), "source": Value("string"),
        # the kind of negative reply in the item (data_builder.negatives: degenerate, policy_generic, other_round, ...)
        "negative": Value("string"),
    })


@lru_cache(maxsize=1)
def grpo_features() -> Features:
    """The column types of a GRPO prompt split."""
    from datasets import Features, List, Value

    msg = {"role": Value("string"), "content": Value("string")}
    turn = {"role": Value("string"), "text": Value("string")}
    return Features({"dialogue_id": Value("string"), "history": List(turn), "reference": Value("string"),
                     "prompt": List(msg)})


def heldout_dialogues(dialogue_ids: Iterable[str], fraction: float, seed: int = 0) -> set[str]:
    """The base dialogue ids held out: the ``round(fraction * n)`` ids (at least one when n >= 2 and
    fraction > 0) with the smallest seeded hash. Deterministic, and stable when ids are added."""
    if not 0.0 <= fraction < 1.0:
        raise ValueError("heldout fraction must be within [0, 1)")
    bases = sorted({base_dialogue_id(i) for i in dialogue_ids})
    n = round(fraction * len(bases))
    if fraction > 0 and n == 0 and len(bases) >= 2:
        n = 1
    return set(sorted(bases, key=lambda b: stable_unit("heldout", seed, b))[:n])


def _verdicts(labels: dict[str, Any], components: Sequence[str]) -> dict[str, Verdict]:
    return {c: Preference(str(labels[c])) if c == PREFERENCE else _bool(labels[c]) for c in components}


def _bool(value: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"a step or reply label must be a boolean, got {value!r}")
    return value


def judge_row(item: Record, mode: str, template: Template, taxonomy: Taxonomy) -> dict[str, Any] | None:
    """One judge SFT row of ``item`` in ``mode``; None when the candidate lacks what the mode judges (a complete
    CER output; the reply alone for mode ``reply``) or a label the mode needs is missing or invalid."""
    parsed = parse(item["candidate"])
    labels = item.get("labels") or {}
    jmode = JudgeMode(mode)
    components = mode_components(jmode)
    if not (parsed.response is not None if jmode.judges_reply else parsed.ok) or any(c not in labels for c in components):
        return None
    try:
        verdicts = _verdicts(labels, components)
        known = _verdicts(labels, [c for c in (*COMPONENTS, REPLY) if labels.get(c) is not None])
    except (ValueError, TypeError):
        return None
    history = turns_of(item["history"])
    rationales = {k: v for k, v in (item.get("rationales") or {}).items() if isinstance(v, str) and v.strip()}
    messages = render_judge_chat(template, taxonomy, JudgeMode(mode), history, item["reference"], parsed, verdicts,
                                 rationales)
    return {"messages": messages, "dialogue_id": item["dialogue_id"],
            "history": [{"role": t.role.value, "text": t.text} for t in history], "reference": item["reference"],
            "candidate": item["candidate"],
            "labels": {c: (v.value if isinstance(v, Preference) else v) if (v := known.get(c)) is not None else None
                       for c in (*COMPONENTS, REPLY)},
            "mode": mode, "source": str(item.get("source", "silver")), "negative": item.get("negative")}


def label_counts(labels: Iterable[dict[str, Any]]) -> dict[str, dict[str, int]]:
    """Per component, how many rows carry each label (null labels left out): the class balance of a split."""
    out: dict[str, Counter[str]] = {}
    for row in labels:
        for c, v in row.items():
            if v is not None:
                out.setdefault(c, Counter())[str(v)] += 1
    return {c: dict(sorted(n.items())) for c, n in out.items()}


def _dataset(rows: list[dict[str, Any]], features: Features) -> Dataset:
    from datasets import Dataset

    if not rows:
        return Dataset.from_dict({k: [] for k in features}, features=features)
    return Dataset.from_list(rows, features=features)


def build_judge_sft(items: Sequence[Record], modes: Sequence[str] = SFT_MODES, heldout_fraction: float = 0.1,
                    seed: int = 0, template: Template | None = None, taxonomy: Taxonomy | None = None,
                    heldout: set[str] | None = None, train_only: Sequence[Record] = ()) -> dict[str, DatasetDict]:
    """Judge SFT DatasetDicts, one per mode, from in-memory ``judge_item`` records.

    items: records with ``dialogue_id``, ``history``, ``reference``, ``candidate`` (CER text), ``labels`` and
        optionally ``rationales`` and ``source``; rows whose candidate is not complete CER are skipped.
    heldout: base dialogue ids to hold out; by default :func:`heldout_dialogues` of the items' ids.
    train_only: extra records added to ``train`` only, and only when their base dialogue is not held out
        (augmentation: duplicates, rewrites); they never enter ``heldout``.
    Returns ``{mode: DatasetDict(train=..., heldout=...)}`` with the columns of the module docstring.
    """
    from datasets import DatasetDict

    template = template or load_template()
    taxonomy = taxonomy or load_taxonomy()
    held = heldout if heldout is not None else heldout_dialogues((i["dialogue_id"] for i in items), heldout_fraction, seed)
    out: dict[str, DatasetDict] = {}
    for mode in modes:
        JudgeMode(mode)
        split_rows: dict[str, list[dict[str, Any]]] = {s: [] for s in SPLITS}
        for it in progress(items, f"emit judge_sft/{mode}"):
            row = judge_row(it, mode, template, taxonomy)
            if row is not None:
                split_rows["heldout" if base_dialogue_id(it["dialogue_id"]) in held else "train"].append(row)
        for it in train_only:
            if base_dialogue_id(it["dialogue_id"]) in held:
                continue
            row = judge_row(it, mode, template, taxonomy)
            if row is not None:
                split_rows["train"].append(row)
        out[mode] = DatasetDict({s: _dataset(split_rows[s], judge_features()) for s in SPLITS})
    return out


def build_grpo_prompts(rounds: Sequence[Record], heldout_fraction: float = 0.1, seed: int = 0,
                       heldout: set[str] | None = None, taxonomy: Taxonomy | None = None) -> DatasetDict:
    """The GRPO prompt DatasetDict from ``round`` records (history ending with a seeker turn + reference)."""
    from datasets import DatasetDict

    held = heldout if heldout is not None else heldout_dialogues((r["dialogue_id"] for r in rounds), heldout_fraction, seed)
    split_rows: dict[str, list[dict[str, Any]]] = {s: [] for s in SPLITS}
    for r in rounds:
        history = turns_of(r["history"])
        if not history or history[-1].role.value != "seeker":
            continue
        split_rows["heldout" if base_dialogue_id(r["dialogue_id"]) in held else "train"].append({
            "dialogue_id": r["dialogue_id"], "history": [t.to_dict() for t in history], "reference": r["reference"],
            "prompt": policy_messages(history, taxonomy)})
    return DatasetDict({s: _dataset(split_rows[s], grpo_features()) for s in SPLITS})


def make_ablation_sets(base: Sequence[Record], rewrites: Sequence[Record], personas: Sequence[Record],
                       n_extra: int | None = None, modes: Sequence[str] = SFT_MODES, heldout_fraction: float = 0.1,
                       seed: int = 0, template: Template | None = None,
                       taxonomy: Taxonomy | None = None) -> dict[str, dict[str, DatasetDict]]:
    """The paper's augmentation ablation at equal size: ``{"D": ..., "R": ..., "P": ...}``, each
    ``{mode: DatasetDict}``.

    All three share the same held-out split (only ``base`` items of the held-out dialogues) and the same base
    training items; each adds exactly ``n_extra`` training items whose base dialogue is not held out:
    D duplicates base training items (``source: duplicate``), R samples plain rewrites (``rewrites``: judge
    items from ``persona --mode rewrite``), P samples persona rewrites (``personas``). ``n_extra`` defaults to
    the largest size all three can supply; asking for more than a pool holds raises ``ValueError``. Only items with
    every CER label take part (mode-``reply`` items are left out).
    """
    def cer(records: Sequence[Record]) -> list[Record]:  # the ablation is about CER items (mode-reply items aside)
        return [i for i in records if all(c in (i.get("labels") or {}) for c in COMPONENTS)]

    base, rewrites, personas = cer(base), cer(rewrites), cer(personas)
    held = heldout_dialogues((i["dialogue_id"] for i in base), heldout_fraction, seed)
    base_train = [i for i in base if base_dialogue_id(i["dialogue_id"]) not in held]
    pools = {"R": [i for i in rewrites if base_dialogue_id(i["dialogue_id"]) not in held],
             "P": [i for i in personas if base_dialogue_id(i["dialogue_id"]) not in held]}
    if n_extra is None:
        n_extra = min(len(pools["R"]), len(pools["P"]))
    for k, pool in pools.items():
        if n_extra > len(pool):
            raise ValueError(f"ablation {k}: {n_extra} extra items asked, the pool has {len(pool)}")
    if n_extra and not base_train:
        raise ValueError("ablation D: no base training items to duplicate")
    rng = random.Random(seed)
    extra = {"D": [{**base_train[i % len(base_train)], "source": "duplicate"}
                   for i in rng.sample(range(max(n_extra, len(base_train))), n_extra)] if n_extra else [],
             "R": rng.sample(pools["R"], n_extra), "P": rng.sample(pools["P"], n_extra)}
    return {k: build_judge_sft(base, modes, seed=seed, template=template, taxonomy=taxonomy, heldout=held,
                               train_only=extra[k]) for k in ("D", "R", "P")}


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``compeer-data emit``."""
    p = sub.add_parser("emit", help="write the judge SFT sets and the GRPO prompt set (HF datasets)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common(p)
    p.add_argument("--modes", nargs="+", default=list(SFT_MODES), choices=SFT_MODES, help="judge SFT modes")
    p.add_argument("--heldout-fraction", type=float, default=0.1, help="share of dialogues held out")
    p.add_argument("--heldout-from", action="append", default=[], metavar="FILE",
                   help="hold out exactly the dialogues of the records in FILE (e.g. another split's items; "
                        "repeatable); replaces --heldout-fraction")
    p.add_argument("--template", default=DEFAULT_TEMPLATE, help="judge template version or YAML")
    p.add_argument("--taxonomy", default=None, help="strategy taxonomy YAML")
    p.set_defaults(run=run)


def run(args: argparse.Namespace, argv: list[str] | None = None, **_: Any) -> int:
    """Execute the emit stage: judge items → judge_sft/<mode>, round records → grpo_prompts."""
    st = StageRun("emit", args.out, argv, list(args.inputs),
                  params={"modes": args.modes, "heldout_fraction": args.heldout_fraction, "seed": args.seed,
                          "template": args.template, "limit": args.limit, "heldout_from": args.heldout_from})
    from datasets.utils.logging import disable_progress_bar

    disable_progress_bar()
    records = read_records([Path(p) for p in args.inputs], (JUDGE_ITEM, ROUND))
    items = limited([r for r in records if r["record"] == JUDGE_ITEM], args.limit)
    rounds = limited([r for r in records if r["record"] == ROUND], args.limit)
    taxonomy = load_taxonomy(args.taxonomy)
    if args.heldout_from:
        held = {base_dialogue_id(r["dialogue_id"] if "dialogue_id" in r else r["id"])
                for r in read_records([Path(p) for p in args.heldout_from])}
    else:
        held = heldout_dialogues([r["dialogue_id"] for r in (*items, *rounds)], args.heldout_fraction, args.seed)
    sft = build_judge_sft(items, args.modes, template=load_template(args.template), taxonomy=taxonomy, heldout=held)
    counts: dict[str, Any] = {"judge_items": len(items), "rounds": len(rounds), "heldout_dialogues": len(held)}
    for mode, dd in sft.items():
        dd.save_to_disk(str(st.path(f"judge_sft/{mode}")))
        counts[f"judge_sft_{mode}"] = {s: len(dd[s]) for s in SPLITS}
        # items without what the mode judges (a complete CER output; a reply for mode reply) or its labels
        counts[f"judge_skipped_{mode}"] = len(items) - sum(len(dd[s]) for s in SPLITS)
        counts[f"labels_{mode}"] = {s: label_counts(dd[s]["labels"]) for s in SPLITS}
        counts[f"negatives_{mode}"] = {s: dict(sorted(Counter(n or "none" for n in dd[s]["negative"]).items()))
                                       for s in SPLITS}
    counts["sources"] = dict(sorted(Counter(str(i.get("source", "silver")) for i in items).items()))
    prompts = build_grpo_prompts(rounds, heldout=held, taxonomy=taxonomy)
    prompts.save_to_disk(str(st.path("grpo_prompts")))
    counts["grpo_prompts"] = {s: len(prompts[s]) for s in SPLITS}
    st.path("heldout_dialogues.json").write_text(json.dumps(sorted(held), ensure_ascii=False, indent=1),
                                                 encoding="utf-8")
    st.counts = counts
    st.finish(quiet=args.quiet)
    return 0
