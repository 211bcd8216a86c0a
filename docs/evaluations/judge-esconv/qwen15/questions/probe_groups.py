"""Groups that ask one question of a judge: does it rank the real reply above a content-free *question* as surely as
above a content-free *statement*? (issue 23, 2026-12-08, for `compeer-train judge-contrast` on this CPU.)

From the first N valid contrast groups of the 2026-12-08 build (`groups.jsonl` sha256 0cfb91e1..., built with
`POLICY_NEGATIVES="<v3's five files> data_builder/data/policy_negatives_grpo_round6.jsonl.xz" bash
tools/gpu/esconv_data.sh ../shared/data/esconv DATA`), each probe group keeps the real turn (`positive`, its
reasoning parts correct) and gets two candidates with the same three reasoning parts word for word and another reply:
- `generic_question`: one of the eval pool's question-form generic texts (`silver.yaml`, English, the k-th of them
  for group k, in turn);
- `generic_statement`: one of the eval pool's statement generic texts, chosen the same way.
Neither text says anything of the conversation, so a judge that reads the reply ranks the real one above both alike;
one that pays for a question ranks the question higher more often. Only the gold reference is used.

    PYTHONPATH=. python docs/evaluations/judge-esconv/qwen15/questions/probe_groups.py DATA/contrast/groups.jsonl N OUT
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
from pathlib import Path

from data_builder.cues import asks_question
from data_builder.silver_text import load_config

GROUPS = "0cfb91e144be93236fe2e40bb7b9955d3ad416a57ead4de14f9ca98507c5fbf1"
RESPONSE = re.compile(r"<response>.*?</response>", re.DOTALL)


def main(groups_path: Path, n: int, out: Path) -> None:
    digest = hashlib.sha256(groups_path.read_bytes()).hexdigest()
    if digest != GROUPS:
        sys.exit(f"{groups_path}: sha256 {digest}, not the 2026-12-08 build's groups ({GROUPS[:12]})")
    texts = load_config().hack_texts("en", "generic", "eval")
    questions = [t for t in texts if asks_question(t)]
    statements = [t for t in texts if not asks_question(t)]
    rows = []
    for k, line in enumerate(groups_path.open()):
        if k >= n:
            break
        g = json.loads(line)
        positive = g["candidates"]["positive"]
        assert len(RESPONSE.findall(positive)) == 1, g["dialogue_id"]
        made = {"generic_question": questions[k % len(questions)], "generic_statement": statements[k % len(statements)]}
        rows.append({**g, "references": {"gold": g["references"]["gold"]},
                     "candidates": {"positive": positive,
                                    **{kind: RESPONSE.sub(f"<response>{text}</response>", positive)
                                       for kind, text in made.items()}},
                     "negatives": {kind: {"kind": kind, "source": "rule", "rule": "template"} for kind in made}})
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    print(f"{len(rows)} probe groups -> {out} ({len(questions)} question texts, {len(statements)} statement texts)")


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3]))
