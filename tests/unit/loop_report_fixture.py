"""Synthetic loop folders the report reads (tests/unit/test_compeer_loop_seeds.py): one folder per seed, built with
``test_compeer_loop._loop_folder``, with evaluation records the independent scorer compared (``_rec`` of
test_compeer_loop_independent.py) and training metrics for the curves.

``python -m tests.unit.loop_report_fixture OUT`` writes the report of :func:`single_root` to ``OUT`` with the paths
replaced as the test replaces them. The golden files ``tests/fixtures/compeer_loop/single-root-report.md`` and
``single-root-figures.json`` were written so by the code before the report read several folders (commit a421b88):
one folder must still give that report byte for byte. Four changes since are on purpose: each policy's line of most
frequent reply and marks also lists the strategies its replies name (a collapse onto one strategy shows there), the
most frequent reply's share has a bias-shifted interval (its plain bootstrap interval lay above the figure), and the
skeptic table has the independent scorer's win share among replies of about the real reply's length (figures
``independent_win_share_matched``, ``independent_matched_share``; none of the fixture's replies is in the band), and
the training table has the reward's slope over the second half of the steps (``n/a`` here: 8 steps, too few).
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from tests.unit.test_compeer_loop import _loop_folder
from tests.unit.test_compeer_loop_independent import _rec

#: evaluation prompts per policy and seed
PROMPTS = 12
GOLDEN = Path(__file__).resolve().parents[1] / "fixtures" / "compeer_loop"


def records(policy: str, wins: list[float], seed: int) -> list[dict[str, Any]]:
    """One evaluation record per prompt: ``wins[i]`` the independent scorer's win on prompt i (1, 0.5 or 0), the
    named strategy right on a win, a judge total that follows the win."""
    out = []
    for i, w in enumerate(wins):
        verdicts = {1.0: ("A", "B"), 0.5: ("A", "A"), 0.0: ("B", "A")}[w]
        out.append(_rec(i, f"{policy} says reply {i} about the job and the nights without sleep",
                        independent_win=w, independent_status="ok", independent_first_position=0.5,
                        independent_as_a=verdicts[0], independent_as_b=verdicts[1], judge_status="ok",
                        reward_total=1.0 + w + 0.1 * (i % 3), reward_steps_mean=0.5, reward_preference=w - 0.5,
                        reward_format=1.0, strategy="Question" if w >= 0.5 or (i + seed) % 5 == 0 else "Reflection"))
    return out


def seed_folder(root: Path, seed: int, wins: dict[str, list[float]], **settings: Any) -> Path:
    """A loop folder of ``seed`` (arms: a and every GRPO arm named in ``wins``) whose policies ``wins`` were evaluated,
    each GRPO arm with 8 logged steps whose reward starts at ``seed``."""
    arms = ["a", *[p for p in wins if p not in ("base", "a")]]
    _loop_folder(root, arms, list(wins), f"warmup-of-seed-{seed}", seed=seed, **settings)
    for policy, ws in wins.items():
        (root / "eval" / policy / "records.jsonl").write_text(
            "".join(json.dumps(r) + "\n" for r in records(policy, ws, seed)))
    for arm in arms[1:]:
        (root / arm / "metrics.jsonl").write_text("".join(json.dumps({
            "step": k, "reward": seed + 0.1 * k, "completions/clipped_ratio": 0.3 - 0.02 * k,
            "completions/mean_length": 20.0 + k, "compeer/format_reward_mean": 0.5 + 0.05 * k,
            "compeer/preference_reward_mean": -0.5}) + "\n" for k in range(1, 9)))
    return root


def single_root(base: Path) -> Path:
    """One loop folder, seed 0: base, a, b and c evaluated, c ahead of a and b on most prompts."""
    return seed_folder(base / "loop", 0, {"base": [0.0] * PROMPTS, "a": [0.0, 0.5, 0.0, 1.0] * 3,
                                          "b": [0.5, 0.0, 0.5, 0.5] * 3, "c": [1.0, 0.5, 1.0, 0.5] * 3})


def single_root_report(base: Path) -> tuple[str, str]:
    """(report.md, figures.json) of :func:`single_root`, the output folder's path replaced by ``OUT``."""
    from compeer_loop.report import write_report

    out = base / "out"
    write_report(single_root(base), out, n_boot=50)
    return ((out / "report.md").read_text().replace(str(out), "OUT"), (out / "figures.json").read_text())


if __name__ == "__main__":
    target = Path(sys.argv[1])
    target.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        report, figures = single_root_report(Path(tmp))
    (target / "single-root-report.md").write_text(report)
    (target / "single-root-figures.json").write_text(figures)
