"""Human pairwise evaluation (the paper's Fig. 6): model-vs-model pairs out to annotators, votes back in.

Export (``pairs_dir``): for every item id both runs finished, one pair shown in a random order (seeded):
``pairs.csv`` (for spreadsheets: pair_id, item_id, context, left, right, and an empty vote column),
``labelstudio_tasks.json`` + ``labelstudio_config.xml`` (a Label Studio project: import the tasks, paste the config),
and ``pairs_key.json``, which records which model is on the left of each pair (kept from annotators).

Import: votes as CSV (``pair_id,vote[,annotator]``; vote ``left`` | ``right`` | ``tie``) or Label Studio's JSON
export. Each vote counts for model A (the first run of the export) as a win, tie or loss. Rates are over votes;
their 95% confidence intervals come from a bootstrap over pairs (all votes of a resampled pair go with it).
"""

from __future__ import annotations

import csv
import json
import random
from pathlib import Path
from typing import Any

import numpy as np

from evaluator.runs import RunDir

VOTES = ("left", "right", "tie")
KEY = "pairs_key.json"
LS_CONFIG = """<View>
  <Header value="Which supporter helps the seeker more?"/>
  <Text name="context" value="$context"/>
  <Text name="left" value="$left"/>
  <Text name="right" value="$right"/>
  <Choices name="vote" toName="left" choice="single" showInLine="true" required="true">
    <Choice value="left" alias="left"/>
    <Choice value="tie" alias="tie"/>
    <Choice value="right" alias="right"/>
  </Choices>
</View>
"""


class VoteError(ValueError):
    """A votes file that does not fit the exported pairs; the message names the file and row."""


def _side(record: dict[str, Any]) -> tuple[str, str]:
    """(context, shown text) of one run's item: the card/profile/history and the model's dialogue or reply."""
    if "dialogue" in record:
        persona = record.get("card", {}).get("base") or json.dumps(record.get("profile", {}), ensure_ascii=False)
        text = "\n".join(f"{t['role'].capitalize()}: {t['text']}" for t in record["dialogue"])
        return persona, text
    context = "\n".join(f"{t['role'].capitalize()}: {t['text']}" for t in record.get("history", []))
    return context, record["text"]


def export_pairs(run_a: Path, run_b: Path, out: Path, seed: int = 0) -> dict[str, Any]:
    """Write the pair files for the items both runs finished; return the key (also written to ``pairs_key.json``)."""
    a, b = RunDir(run_a), RunDir(run_b)
    ha, hb = a.manifest()["harness"], b.manifest()["harness"]
    if ha != hb:
        raise ValueError(f"runs of different harnesses ({ha} vs {hb}) cannot be paired")
    ra, rb = a.finished(), b.finished()
    common = [i for i in ra if i in rb]
    if not common:
        raise ValueError(f"{run_a} and {run_b} share no finished item")
    rng = random.Random(seed)
    out.mkdir(parents=True, exist_ok=True)
    rows, tasks, order = [], [], {}
    for n, item in enumerate(common):
        pair_id = f"p{n:04d}"
        context, text_a = _side(ra[item])
        _, text_b = _side(rb[item])
        a_left = rng.random() < 0.5
        left, right = (text_a, text_b) if a_left else (text_b, text_a)
        order[pair_id] = {"item_id": item, "left": "A" if a_left else "B"}
        rows.append({"pair_id": pair_id, "item_id": item, "context": context, "left": left, "right": right, "vote": ""})
        tasks.append({"data": {"pair_id": pair_id, "item_id": item, "context": context, "left": left, "right": right}})
    with (out / "pairs.csv").open("w", encoding="utf-8", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    (out / "labelstudio_tasks.json").write_text(json.dumps(tasks, indent=2, ensure_ascii=False), encoding="utf-8")
    (out / "labelstudio_config.xml").write_text(LS_CONFIG, encoding="utf-8")
    key = {"A": str(run_a), "B": str(run_b), "harness": ha, "seed": seed, "pairs": order}
    (out / KEY).write_text(json.dumps(key, indent=2, ensure_ascii=False), encoding="utf-8")
    return key


def read_votes(path: Path) -> list[tuple[str, str, str]]:
    """``(pair_id, vote, annotator)`` from a votes CSV or a Label Studio JSON export (cancelled ones skipped)."""
    if path.suffix.lower() == ".json":
        data = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(data, list):
            raise VoteError(f"{path}: expected Label Studio's JSON export (a list of tasks)")
        votes = []
        for i, task in enumerate(data):
            pair_id = (task.get("data") or {}).get("pair_id")
            if not pair_id:
                raise VoteError(f"{path}: task [{i}] has no data.pair_id (was it exported from these pairs?)")
            for ann in task.get("annotations", []):
                if ann.get("was_cancelled"):
                    continue
                choices = [c for r in ann.get("result", []) if r.get("type") == "choices"
                           for c in r.get("value", {}).get("choices", [])]
                if len(choices) != 1 or choices[0] not in VOTES:
                    raise VoteError(f"{path}: task [{i}] annotation {ann.get('id')}: expected one choice of "
                                    f"{'/'.join(VOTES)}, got {choices}")
                votes.append((str(pair_id), choices[0], str(ann.get("completed_by", ""))))
        return votes
    votes = []
    with path.open(encoding="utf-8", newline="") as fh:
        for n, row in enumerate(csv.DictReader(fh), 2):
            vote = (row.get("vote") or "").strip().lower()
            if not vote:
                continue  # not annotated yet
            if vote not in VOTES or not row.get("pair_id"):
                raise VoteError(f"{path}:{n}: expected pair_id and vote {'|'.join(VOTES)}, got {vote!r}")
            votes.append((row["pair_id"].strip(), vote, (row.get("annotator") or "").strip()))
    return votes


def outcomes(votes: list[tuple[str, str, str]], key: dict[str, Any]) -> list[tuple[str, int]]:
    """Each vote as ``(pair_id, +1 A wins | 0 tie | -1 A loses)``."""
    out = []
    for pair_id, vote, _ in votes:
        if pair_id not in key["pairs"]:
            raise VoteError(f"vote for unknown pair {pair_id!r} (not in {KEY})")
        if vote == "tie":
            out.append((pair_id, 0))
        else:
            a_left = key["pairs"][pair_id]["left"] == "A"
            out.append((pair_id, 1 if (vote == "left") == a_left else -1))
    return out


def _rates(values: np.ndarray) -> np.ndarray:
    return np.array([(values == 1).mean(), (values == 0).mean(), (values == -1).mean()])


def win_rates(results: list[tuple[str, int]], n_boot: int = 2000, seed: int = 0) -> dict[str, Any]:
    """Win / tie / loss rates of model A with 95% bootstrap intervals (pairs resampled with their votes)."""
    if not results:
        raise VoteError("no votes")
    by_pair: dict[str, list[int]] = {}
    for pair_id, v in results:
        by_pair.setdefault(pair_id, []).append(v)
    groups = [np.array(v) for v in by_pair.values()]
    point = _rates(np.concatenate(groups))
    rng = np.random.default_rng(seed)
    boots = np.empty((n_boot, 3))
    for i in range(n_boot):
        pick = rng.integers(0, len(groups), len(groups))
        boots[i] = _rates(np.concatenate([groups[j] for j in pick]))
    lo, hi = np.percentile(boots, 2.5, axis=0), np.percentile(boots, 97.5, axis=0)
    names = ("win", "tie", "loss")
    return {"votes": len(results), "pairs": len(groups),
            **{n: {"rate": float(point[k]), "ci95": [float(lo[k]), float(hi[k])]} for k, n in enumerate(names)}}


def import_votes(pairs_dir: Path, votes_path: Path, out: Path, n_boot: int = 2000, seed: int = 0) -> dict[str, Any]:
    """Read votes, compute the rates, write ``pairwise.json``, ``pairwise.md`` and ``pairwise.png``."""
    key = json.loads((pairs_dir / KEY).read_text(encoding="utf-8"))
    rates = win_rates(outcomes(read_votes(votes_path), key), n_boot, seed)
    result = {"A": key["A"], "B": key["B"], "harness": key["harness"], **rates}
    out.mkdir(parents=True, exist_ok=True)
    (out / "pairwise.json").write_text(json.dumps(result, indent=2), encoding="utf-8")
    _plot(result, out / "pairwise.png")
    rows = [f"# Human pairwise evaluation: A = `{key['A']}` vs B = `{key['B']}`", "",
            (f"{rates['votes']} votes on {rates['pairs']} pairs ({key['harness']}); rates for A, 95% bootstrap "
             "intervals over pairs."), "", "| outcome for A | rate | 95% CI |", "|---|---|---|"]
    for n in ("win", "tie", "loss"):
        lo, hi = rates[n]["ci95"]
        rows.append(f"| {n} | {100 * rates[n]['rate']:.1f}% | {100 * lo:.1f}-{100 * hi:.1f}% |")
    rows += ["", "![pairwise](pairwise.png)", ""]
    (out / "pairwise.md").write_text("\n".join(rows), encoding="utf-8")
    return result


def _plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 1.8))
    left = 0.0
    for name, color in (("win", "#4c9f70"), ("tie", "#b0b0b0"), ("loss", "#d1605e")):
        rate = result[name]["rate"]
        ax.barh([0], [rate], left=left, color=color, label=f"{name} {100 * rate:.1f}%")
        left += rate
    ax.errorbar([result["win"]["rate"]], [0], xerr=[[result["win"]["rate"] - result["win"]["ci95"][0]],
                                                      [result["win"]["ci95"][1] - result["win"]["rate"]]],
                fmt="none", ecolor="black", capsize=4)
    ax.set_xlim(0, 1)
    ax.set_yticks([])
    ax.set_title(f"A vs B: {Path(result['A']).name} vs {Path(result['B']).name} ({result['votes']} votes)")
    ax.legend(ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.3), fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
