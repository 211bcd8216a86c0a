"""Benchmark: ``compeer-data ingest`` + ``compeer-data sample`` on 10,000 generated ESConv-format dialogues.

Goal (issue 4): both stages together in under 30 s on this machine. Each stage runs as its own process, as
``compeer-data`` would (interpreter start and imports included); prints and records the time per stage, the
throughput and each stage process's peak memory (VmHWM). Run: ``python -m bench.data_builder_ingest [N]``.
Writes ``bench/results/data_builder_ingest.json``; exits 1 when the goal is missed.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import print_table, write_result

GOAL_S = 30.0
STRATEGIES = ["Question", "Restatement or Paraphrasing", "Reflection of Feelings", "Self-disclosure",
              "Affirmation and Reassurance", "Providing Suggestions", "Information", "Others"]
EN_WORDS = ["work", "sleep", "friend", "family", "exam", "money", "worried", "tired", "alone", "hope", "plan", "talk", "feel", "week", "call", "help"]
ZH_WORDS = list("工作睡眠朋友家人考试压力担心疲惫孤单希望计划聊天感觉帮助")


def make_dialogue(rng: random.Random, i: int) -> dict:
    """One synthetic ESConv-format dialogue (10-30 turns, English or Chinese)."""
    zh = i % 4 == 0
    words = ZH_WORDS if zh else EN_WORDS
    sep = "" if zh else " "
    dialog = []
    for t in range(rng.randint(10, 30)):
        speaker = "seeker" if t % 2 == 0 or rng.random() < 0.15 else "supporter"
        text = sep.join(rng.choice(words) for _ in range(rng.randint(6, 24)))
        ann = {"strategy": rng.choice(STRATEGIES)} if speaker == "supporter" else {"feedback": str(rng.randint(1, 5))}
        dialog.append({"speaker": speaker, "annotation": ann, "content": text})
    return {"experience_type": "Previous Experience", "emotion_type": rng.choice(["anxiety", "sadness", "anger"]),
            "problem_type": rng.choice(["job crisis", "breakup with partner", "academic pressure"]),
            "situation": sep.join(rng.choice(words) for _ in range(12)),
            "survey_score": {"seeker": {"initial_emotion_intensity": str(rng.randint(1, 5)), "empathy": "4",
                                        "relevance": "5", "final_emotion_intensity": str(rng.randint(1, 5))},
                             "supporter": {"relevance": "4"}},
            "dialog": dialog}


_CHILD = (
    "import sys\n"
    "from data_builder.cli import main\n"
    "rc = main(sys.argv[2:])\n"
    "hwm = [l for l in open('/proc/self/status') if l.startswith('VmHWM:')][0].split()[1]\n"
    "open(sys.argv[1], 'w').write(hwm)\n"
    "sys.exit(rc)\n"
)


def run_stage(args: list[str], tmp: str) -> float:
    """Run one stage in its own process (``data_builder.cli.main``, as the console script does); returns that
    process's peak resident memory in MB (its own VmHWM, read at exit: not inherited from this process)."""
    hwm_file = Path(tmp) / "hwm.txt"
    subprocess.run([sys.executable, "-c", _CHILD, str(hwm_file), *args], check=True)
    return int(hwm_file.read_text()) / 1024


def main(argv: list[str] | None = None) -> int:
    """Generate, ingest, sample; print the table; write the result file."""
    args = sys.argv[1:] if argv is None else argv
    n = int(args[0]) if args else 10_000
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    rng = random.Random(0)
    with tempfile.TemporaryDirectory(prefix="bench-data-builder-") as tmp:
        src = Path(tmp) / "esconv.json"
        src.write_text(json.dumps([make_dialogue(rng, i) for i in range(n)], ensure_ascii=False), encoding="utf-8")
        size_mb = src.stat().st_size / 2**20
        t0 = time.perf_counter()
        rss_ingest = run_stage(["ingest", "--quiet", "--format", "esconv", "--out", f"{tmp}/ingest", str(src)], tmp)
        t1 = time.perf_counter()
        rss_sample = run_stage(["sample", "--quiet", "--rounds", "3", "--out", f"{tmp}/sample",
                                f"{tmp}/ingest/dialogues.jsonl"], tmp)
        t2 = time.perf_counter()
        ing = json.loads(Path(f"{tmp}/ingest/manifest.json").read_text())["counts"]
        smp = json.loads(Path(f"{tmp}/sample/manifest.json").read_text())["counts"]
    total = t2 - t1 + (t1 - t0)
    figures = {"dialogues": n, "input_mb": round(size_mb, 2), "ingest_s": round(t1 - t0, 3),
               "sample_s": round(t2 - t1, 3), "total_s": round(total, 3), "goal_s": GOAL_S,
               "total_over_goal": round(total / GOAL_S, 4), "dialogues_per_s": round(n / total, 1),
               "kept": ing["kept"], "rounds_sampled": smp["rounds_sampled"],
               "peak_rss_ingest_mb": round(rss_ingest, 1), "peak_rss_sample_mb": round(rss_sample, 1),
               "passed": total < GOAL_S}
    out = write_result("data_builder_ingest", figures)
    print_table(f"data_builder ingest + sample, {n} dialogues ({size_mb:.1f} MB ESConv JSON)", [
        ("ingest (s)", figures["ingest_s"], ""),
        ("sample (s)", figures["sample_s"], ""),
        ("total (s)", figures["total_s"], f"goal < {GOAL_S:.0f} s"),
        ("total / goal", figures["total_over_goal"], "< 1"),
        ("dialogues / s", figures["dialogues_per_s"], ""),
        ("rounds sampled", figures["rounds_sampled"], ""),
        ("peak RSS ingest (MB)", figures["peak_rss_ingest_mb"], "VmHWM of the `compeer-data ingest` process"),
        ("peak RSS sample (MB)", figures["peak_rss_sample_mb"], "VmHWM of the `compeer-data sample` process"),
    ])
    print(f"\nwrote {out}")
    return 0 if figures["passed"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
