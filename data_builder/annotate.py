"""Stage 6, annotate: export labelling tasks, import two annotators and an adjudicator, keep consensus items.

``compeer-data annotate export --out DIR GENERATIONS...`` writes, for each generated candidate:
``tasks.jsonl`` (the full task), ``tasks.csv`` (one row per task with empty ``step1 step2 step3 preference
rationale`` columns to fill in), ``label_studio_tasks.json`` and ``label_studio_config.xml`` (a Label Studio
labelling interface: choices ``step1..step3`` True/False, ``preference`` first/second/both_good/neither).
Reply 1 is always the original supporter reply, reply 2 the generated one (the judge sees them in that order).

``compeer-data annotate import --out DIR --annotator A --annotator B [--adjudicator C] TASKS.jsonl`` reads
label files (``.csv`` as exported, ``.jsonl`` with ``task_id`` and the label fields, or a Label Studio JSON
export), then per component keeps the label given by at least two of the three people
(:func:`consensus`); an item is kept only when all four components reach that agreement, and becomes a
``judge_item`` with ``source: annotated``. Cohen's kappa between the two annotators is reported per step and
for the preference (scikit-learn), with raw agreement and the share of False step labels.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from xml.sax.saxutils import escape

from cer.agreement import kappa as cohen_kappa
from cer.agreement import label_matrix
from cer.reasoning import parse
from cer.verdicts import Preference, parse_label
from data_builder.records import GENERATION, JUDGE_ITEM, Record, read_jsonl, read_records, turns_of, write_jsonl
from data_builder.stage import StageError, StageRun, add_common, limited, progress
from judge.protocol import COMPONENTS, PREFERENCE, component_kind, render_history

Label = bool | str
LabelSet = dict[str, dict[str, Label]]  # task_id -> component -> label
LABEL_COLUMNS = (*COMPONENTS, "rationale")


def task_id(record: Record) -> str:
    """Stable id of a labelling task: hash of dialogue id, round and candidate text."""
    key = json.dumps([record["dialogue_id"], record.get("round_index"), record["candidate"]], ensure_ascii=False)
    return hashlib.sha256(key.encode("utf-8")).hexdigest()[:16]


def make_task(record: Record) -> Record:
    """A labelling task from a generation (or any record with history, reference and CER candidate)."""
    parsed = parse(record["candidate"])
    if not parsed.ok:
        raise ValueError("candidate is not a complete CER output")
    return {"task_id": task_id(record), "dialogue_id": record["dialogue_id"], "round_index": record.get("round_index"),
            "lang": record.get("lang", "en"), "history": record["history"], "reference": record["reference"],
            "candidate": record["candidate"], "analysis": parsed.parts["analysis"], "emotion": parsed.parts["emotion"],
            "strategy": parsed.parts["strategy"], "response": parsed.response}


def label_studio_config() -> str:
    """The Label Studio labelling interface (XML) for the exported tasks."""
    def choices(name: str, to: str, values: Sequence[str]) -> str:
        inner = "".join(f'<Choice value="{escape(v)}"/>' for v in values)
        return f'  <Choices name="{name}" toName="{to}" choice="single" required="true">{inner}</Choices>\n'
    steps = ("True", "False")
    prefs = [p.value for p in Preference]
    return ("<View>\n"
            '  <Header value="Conversation so far"/>\n  <Text name="history" value="$history_text"/>\n'
            '  <Header value="Step 1: conversation analysis (core issue, support stage)"/>\n'
            '  <Text name="analysis" value="$analysis"/>\n' + choices("step1", "analysis", steps) +
            '  <Header value="Step 2: emotional state (sentiment, emotion, intensity)"/>\n'
            '  <Text name="emotion" value="$emotion"/>\n' + choices("step2", "emotion", steps) +
            '  <Header value="Step 3: support strategy"/>\n'
            '  <Text name="strategy" value="$strategy"/>\n' + choices("step3", "strategy", steps) +
            '  <Header value="Reply 1 (first)"/>\n  <Text name="reference" value="$reference"/>\n'
            '  <Header value="Reply 2 (second)"/>\n  <Text name="response" value="$response"/>\n' +
            choices("preference", "response", prefs) +
            '  <TextArea name="rationale" toName="history" placeholder="optional: why" maxSubmissions="1"/>\n'
            "</View>\n")


def export_tasks(records: list[Record], out: Path, st: StageRun) -> dict[str, int]:
    """Write tasks.jsonl, tasks.csv, label_studio_tasks.json and label_studio_config.xml; returns counts."""
    tasks, skipped = [], 0
    for r in progress(records, "annotate export"):
        if not r.get("candidate"):
            skipped += 1
            continue
        try:
            tasks.append(make_task(r))
        except ValueError:
            skipped += 1
    write_jsonl(st.path("tasks.jsonl"), tasks)
    cols = ["task_id", "dialogue_id", "round_index", "lang", "history", "analysis", "emotion", "strategy",
            "reference", "response", *LABEL_COLUMNS]
    with st.path("tasks.csv").open("w", encoding="utf-8", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=cols)
        w.writeheader()
        for t in tasks:
            row = {c: t.get(c, "") for c in cols}
            row["history"] = render_history(turns_of(t["history"]))
            w.writerow(row)
    ls = [{"data": {**{k: v for k, v in t.items() if k != "history"},
                    "history_text": render_history(turns_of(t["history"]))}} for t in tasks]
    st.path("label_studio_tasks.json").write_text(json.dumps(ls, ensure_ascii=False, indent=1), encoding="utf-8")
    st.path("label_studio_config.xml").write_text(label_studio_config(), encoding="utf-8")
    return {"records": len(records), "tasks": len(tasks), "skipped_not_cer": skipped}


# --- import -------------------------------------------------------------------------------------------------

def _parse(component: str, raw: Any) -> Label | None:
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return None
    if isinstance(raw, bool):
        return raw if component != PREFERENCE else None
    v = parse_label(component_kind(component), str(raw))
    if isinstance(v, Preference):
        return v.value
    return v


def read_labels(path: Path) -> tuple[LabelSet, dict[str, dict[str, str]], int]:
    """One person's labels: ``{task_id: {component: label}}``, rationales, and the count of invalid labels.

    Accepts the exported CSV filled in, JSONL (``task_id`` plus ``step1..preference`` fields or a ``labels``
    object) or a Label Studio JSON export (``data.task_id`` and choices named ``step1..preference``).
    """
    rows: list[dict[str, Any]] = []
    if path.suffix == ".csv":
        with path.open(encoding="utf-8-sig", newline="") as fh:
            rows = list(csv.DictReader(fh))
    elif path.suffix == ".json":
        data = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(data, list):
            raise StageError(f"{path}: expected a Label Studio export (a JSON list of tasks)")
        for task in data:
            anns = [a for a in task.get("annotations", []) if not a.get("was_cancelled")]
            if not anns:
                continue
            row: dict[str, Any] = {"task_id": task.get("data", {}).get("task_id")}
            for res in anns[-1].get("result", []):
                val = res.get("value", {})
                if val.get("choices"):
                    row[res.get("from_name")] = val["choices"][0]
                elif val.get("text"):
                    row[res.get("from_name")] = val["text"][0]
            rows.append(row)
    else:
        for rec in read_jsonl(path):
            rows.append({**rec, **rec.get("labels", {})} if isinstance(rec.get("labels"), dict) else rec)
    labels: LabelSet = {}
    rationales: dict[str, dict[str, str]] = {}
    invalid = 0
    for row in rows:
        tid = str(row.get("task_id") or "")
        if not tid:
            invalid += 1
            continue
        got: dict[str, Label] = {}
        for c in COMPONENTS:
            v = _parse(c, row.get(c))
            if v is None and row.get(c) not in (None, ""):
                invalid += 1
            if v is not None:
                got[c] = v
        labels[tid] = got
        if row.get("rationale"):
            rationales[tid] = {"text": str(row["rationale"])}
    return labels, rationales, invalid


def consensus(votes: Sequence[Label | None]) -> Label | None:
    """The label at least two of the voters gave (None votes ignored); None when no two agree."""
    counts = Counter(v for v in votes if v is not None)
    if not counts:
        return None
    label, n = counts.most_common(1)[0]
    return label if n >= 2 else None


def labels_kappa(a: Sequence[Label], b: Sequence[Label]) -> float | None:
    """Cohen's kappa (:func:`cer.agreement.kappa`, the one definition) of two aligned label lists; None when
    undefined (fewer than 2 items or a single label used throughout, where chance agreement is 1)."""
    if len(a) != len(b):
        raise ValueError("kappa: label lists differ in length")
    if len(a) < 2 or len(set(map(str, a)) | set(map(str, b))) < 2:
        return None
    return cohen_kappa(label_matrix([str(x) for x in a], [str(x) for x in b]))


def agreement_report(first: LabelSet, second: LabelSet) -> dict[str, dict[str, Any]]:
    """Per component: items both labelled, raw agreement, Cohen's kappa."""
    out: dict[str, dict[str, Any]] = {}
    for c in COMPONENTS:
        common = [t for t in first if t in second and c in first[t] and c in second[t]]
        a = [first[t][c] for t in common]
        b = [second[t][c] for t in common]
        out[c] = {"items": len(common), "agreement": (sum(x == y for x, y in zip(a, b)) / len(common)) if common else None,
                  "kappa": labels_kappa(a, b)}
    return out


def merge(tasks: list[Record], people: list[LabelSet], rationales: list[dict[str, dict[str, str]]]) -> tuple[list[Record], list[Record], Counter[str]]:
    """Consensus items (judge items, ``source: annotated``) and dropped tasks with the components lacking agreement."""
    kept, dropped = [], []
    counts: Counter[str] = Counter()
    for t in tasks:
        tid = t["task_id"]
        labels: dict[str, Label] = {}
        missing = []
        for c in COMPONENTS:
            v = consensus([p.get(tid, {}).get(c) for p in people])
            if v is None:
                missing.append(c)
            else:
                labels[c] = v
        if missing:
            counts["dropped"] += 1
            for c in missing:
                counts[f"no_agreement_{c}"] += 1
            dropped.append({"task_id": tid, "no_agreement": missing})
            continue
        if all(p.get(tid, {}).get(c) is not None for p in people[:2] for c in COMPONENTS) and \
                all(people[0][tid][c] == people[1][tid][c] for c in COMPONENTS):
            counts["agreed_without_adjudicator"] += 1
        else:
            counts["adjudicated"] += 1
        why = next((r[tid]["text"] for r in rationales if tid in r), None)
        kept.append({"record": JUDGE_ITEM, "item_id": f"{t['dialogue_id']}/r{t.get('round_index')}/{tid}",
                     "dialogue_id": t["dialogue_id"], "round_index": t.get("round_index"), "lang": t.get("lang", "en"),
                     "history": t["history"], "reference": t["reference"], "candidate": t["candidate"],
                     "labels": labels, "rationales": {c: why for c in COMPONENTS} if why else {},
                     "source": "annotated", "task_id": tid})
    counts["kept"] = len(kept)
    return kept, dropped, counts


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``compeer-data annotate``."""
    p = sub.add_parser("annotate", help="export labelling tasks / import labels with consensus and kappa",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("action", choices=("export", "import"), help="export tasks, or import labels")
    add_common(p)
    p.add_argument("--annotator", action="append", type=Path, default=[],
                   help="(import) a label file of one annotator; give exactly two")
    p.add_argument("--adjudicator", type=Path, default=None, help="(import) the adjudicator's label file")
    p.set_defaults(run=run)


def run(args: argparse.Namespace, argv: list[str] | None = None, **_: Any) -> int:
    """Execute ``annotate export`` or ``annotate import``."""
    inputs = [Path(p) for p in args.inputs]
    if args.action == "export":
        st = StageRun("annotate-export", args.out, argv, list(args.inputs), params={"limit": args.limit})
        records = limited(read_records(inputs, (GENERATION, JUDGE_ITEM)), args.limit)
        st.counts = export_tasks(records, args.out, st)
        st.finish(quiet=args.quiet)
        return 0
    if len(args.annotator) != 2:
        raise StageError("annotate import: give exactly two --annotator files (and optionally --adjudicator)")
    files = [*args.annotator, *([args.adjudicator] if args.adjudicator else [])]
    st = StageRun("annotate-import", args.out, argv, [*args.inputs, *map(str, files)], params={"limit": args.limit})
    tasks = limited([r for p in inputs for r in read_jsonl(p) if "task_id" in r], args.limit)
    loaded = [read_labels(f) for f in files]
    people = [x[0] for x in loaded]
    kept, dropped, counts = merge(tasks, people, [x[1] for x in loaded])
    write_jsonl(st.path("items.jsonl"), kept)
    write_jsonl(st.path("dropped.jsonl"), dropped)
    n_steps = 3 * len(kept)
    n_false = sum(1 for it in kept for c in COMPONENTS[:3] if it["labels"][c] is False)
    st.counts = {"tasks": len(tasks), "kept": len(kept), "dropped": counts["dropped"],
                 "agreed_without_adjudicator": counts["agreed_without_adjudicator"],
                 "adjudicated": counts["adjudicated"],
                 "no_agreement": {c: counts[f"no_agreement_{c}"] for c in COMPONENTS},
                 "invalid_labels": sum(x[2] for x in loaded),
                 "step_false_share": n_false / n_steps if n_steps else 0.0,
                 "preferences": dict(Counter(str(it["labels"][PREFERENCE]) for it in kept)),
                 "annotators": agreement_report(people[0], people[1])}
    st.finish(quiet=args.quiet)
    return 0


__all__ = ["agreement_report", "consensus", "export_tasks", "label_studio_config", "labels_kappa", "make_task",
           "merge", "read_labels", "task_id"]
