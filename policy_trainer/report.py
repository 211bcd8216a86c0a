"""Run reporting: ``OUT/metrics.jsonl`` (one line per logged step), progress lines, PNG plots and a summary.

``metrics.jsonl`` holds what TRL logs each step (loss, reward, reward_std, frac_reward_zero_std, step_time, ...)
plus the ``compeer/*`` metrics of the reward function. The summary's ``reward_wait_share`` is the time a step
waited on its reward call (``compeer/reward_wait_s``) divided by the step time, summed over the run. With
``log_completions_file`` the summary's ``completions`` says whether the judge pays for degenerate replies: within
each rollout group that has both, the share of (degenerate, other) pairs where the degenerate completion got the
higher reward (ties half).
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Any

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from data_builder.policy_negatives import COMPLETIONS_FILE, COMPLETIONS_GLOB, is_degenerate

log = logging.getLogger(__name__)
METRICS_FILE = "metrics.jsonl"
SUMMARY_FILE = "summary.json"

#: Plot name -> the metric keys drawn on it.
PLOTS: dict[str, tuple[str, ...]] = {
    "reward_components": ("compeer/step_reward_mean", "compeer/preference_reward_mean",
                          "compeer/format_reward_mean", "compeer/graded_step_reward_mean",
                          "compeer/graded_preference_reward_mean"),
    "reward_reweighting": ("compeer/reward_raw_mean", "compeer/reward_reweighted_mean", "reward",
                           "compeer/discrete_total_mean", "compeer/graded_total_mean"),
    "redundancy": ("compeer/s_in_mean", "compeer/s_hi_mean", "compeer/tau_mean"),
    "failures": ("compeer/parse_failure_rate", "compeer/timeout_rate", "compeer/engine_error_rate",
                 "compeer/unscored_rate",
                 "frac_reward_zero_std"),
    "timing": ("step_time", "compeer/reward_wait_s", "compeer/reward_call_latency_s", "compeer/reward_fn_overhead_s"),
}


#: the time a step waited on its reward call (``reward_overlap`` makes it shorter than the call itself)
WAIT_KEY = "compeer/reward_wait_s"
LEGACY_WAIT_KEY = "compeer/reward_call_latency_s"


def _clean(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


class MetricsReport(TrainerCallback):
    """Appends one JSON line per logged training step; warns when groups carry no reward spread."""

    def __init__(self, out_dir: Path, zero_std_warn_fraction: float) -> None:
        self.path = out_dir / METRICS_FILE
        self.zero_std_warn_fraction = zero_std_warn_fraction
        self._warned = False
        self._warned_unscored = False

    def on_log(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
               logs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        if not logs or not state.is_world_process_zero or "train_runtime" in logs:
            return
        row = {"step": state.global_step, **{k: _clean(v) for k, v in logs.items()}}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a") as fh:
            fh.write(json.dumps(row) + "\n")
        wait = row.get(WAIT_KEY, row.get(LEGACY_WAIT_KEY))
        log.info("step %d/%d  reward %s  zero-std groups %s  step %.1fs  reward wait %s", state.global_step,
                 state.max_steps, _fmt(row.get("reward")), _fmt(row.get("frac_reward_zero_std")),
                 row.get("step_time") or float("nan"), _fmt(wait))
        unscored = row.get("compeer/unscored_rate")
        if isinstance(unscored, float) and unscored >= 0.5 and not self._warned_unscored:
            self._warned_unscored = True
            log.warning("%.0f%% of this step's completions got no reward (see compeer/engine_error_rate, "
                        "parse_failure_rate, timeout_rate, reward_call_failures and the reward server's log); "
                        "TRL's frac_reward_zero_std does not count such groups", 100 * unscored)
        frac = row.get("frac_reward_zero_std")
        if isinstance(frac, float) and frac >= self.zero_std_warn_fraction and not self._warned:
            self._warned = True
            log.warning("frac_reward_zero_std = %.2f: most groups have identical rewards, so GRPO gets no signal "
                        "from them. A small policy rarely writes the CER tags: run the SFT warm-up "
                        "(--set sft_warmup_steps=N) or raise num_generations/temperature.", frac)


def _fmt(value: Any) -> str:
    return f"{value:.3f}" if isinstance(value, float) else "n/a"


def read_metrics(out_dir: Path) -> list[dict[str, Any]]:
    path = out_dir / METRICS_FILE
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def clear_run_logs(out_dir: Path) -> None:
    """Remove the metrics and every rank's completions file of an earlier attempt in ``out_dir``: a run that starts
    from step 1 (no checkpoint to resume) logs its steps afresh instead of after the old attempt's lines."""
    (out_dir / METRICS_FILE).unlink(missing_ok=True)
    for completions in out_dir.glob(COMPLETIONS_GLOB):
        completions.unlink()


def truncate_metrics(out_dir: Path, last_step: int) -> None:
    """Drop lines after ``last_step`` (a resumed run re-logs the steps after its checkpoint): the metrics, and the
    completions file's lines of those steps (lines without a ``step``, from older runs, are kept)."""
    rows = [r for r in read_metrics(out_dir) if int(r.get("step", 0)) <= last_step]
    path = out_dir / METRICS_FILE
    if path.exists():
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    for completions in out_dir.glob(COMPLETIONS_GLOB):  # every rank's file
        kept = [line for line in completions.read_text(encoding="utf-8").splitlines(keepends=True)
                if line.strip() and (json.loads(line).get("step") or 0) <= last_step]
        completions.write_text("".join(kept), encoding="utf-8")


def _series(rows: list[dict[str, Any]], key: str) -> tuple[list[int], list[float]]:
    xs, ys = [], []
    for r in rows:
        v = r.get(key)
        if isinstance(v, (int, float)) and math.isfinite(float(v)):
            xs.append(int(r["step"]))
            ys.append(float(v))
    return xs, ys


def write_plots(out_dir: Path, rows: list[dict[str, Any]]) -> list[Path]:
    """One PNG per entry of :data:`PLOTS` under ``OUT/plots``; keys never logged are left out."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    plot_dir = out_dir / "plots"
    plot_dir.mkdir(parents=True, exist_ok=True)
    for name, keys in PLOTS.items():
        fig, ax = plt.subplots(figsize=(7, 4))
        drawn = 0
        for key in keys:
            xs, ys = _series(rows, key)
            if xs:
                ax.plot(xs, ys, marker="o", markersize=3, label=key)
                drawn += 1
        if drawn:
            ax.set_xlabel("step")
            ax.set_title(name.replace("_", " "))
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
            path = plot_dir / f"{name}.png"
            fig.tight_layout()
            fig.savefig(path, dpi=110)
            written.append(path)
        plt.close(fig)
    return written


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per-step time, the share of it spent waiting on rewards, first/last rewards."""
    _, step_times = _series(rows, "step_time")
    # what the trainer waited; files from before reward_overlap logged only the call's latency, which was the wait
    _, waits = _series(rows, WAIT_KEY if any(WAIT_KEY in r for r in rows) else LEGACY_WAIT_KEY)
    _, rewards = _series(rows, "reward")
    _, failures = _series(rows, "compeer/reward_call_failures")
    _, reference_marked = _series(rows, "compeer/reference_degenerate_share")
    out: dict[str, Any] = {"steps_logged": len(rows), "reward_call_failures": sum(failures)}
    if step_times:
        out["step_time_mean_s"] = sum(step_times) / len(step_times)
        out["step_time_median_s"] = sorted(step_times)[len(step_times) // 2]
    if waits:
        out["reward_wait_mean_s"] = sum(waits) / len(waits)
    if step_times and waits and sum(step_times) > 0:
        out["reward_wait_share"] = sum(waits) / sum(step_times)
    if rewards:
        out["reward_first"], out["reward_last"] = rewards[0], rewards[-1]
        k = max(1, len(rewards) // 4)
        out["reward_first_quarter_mean"] = sum(rewards[:k]) / k
        out["reward_last_quarter_mean"] = sum(rewards[-k:]) / k
    if reference_marked:
        # beside the completions' degenerate_share: the rule's rate on the real replies of the same prompts
        out["reference_degenerate_share"] = sum(reference_marked) / len(reference_marked)
    return out


def summarise_completions(path: Path) -> dict[str, Any]:
    """Degenerate share and whether the reward pays for degenerate completions, from a completions file (module
    docstring); rewards that are None (unscored) are left out of the pairs. A group is a run of consecutive lines
    with one (call, group): a resumed run counts its calls from 1 again and appends to the same file."""
    groups: list[list[tuple[bool, float | None]]] = []
    last: tuple[int, int] | None = None
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            c = json.loads(line)
            if (c["call"], c["group"]) != last:
                groups.append([])
                last = (c["call"], c["group"])
            groups[-1].append((is_degenerate(c.get("mark")), c.get("reward")))
    items = [x for g in groups for x in g]
    wins = pairs = 0.0
    mixed = 0
    for g in groups:
        bad = [r for d, r in g if d and r is not None]
        good = [r for d, r in g if not d and r is not None]
        mixed += bool(bad and good)
        for b in bad:
            for o in good:
                pairs += 1
                wins += 1.0 if b > o else 0.5 if b == o else 0.0
    rewards = {flag: [r for d, r in items if d is flag and r is not None] for flag in (True, False)}
    return {"completions": len(items), "groups": len(groups),
            "degenerate_share": sum(d for d, _ in items) / len(items) if items else None,
            "groups_with_both": mixed, "degenerate_wins_share": wins / pairs if pairs else None,
            "reward_mean_degenerate": sum(rewards[True]) / len(rewards[True]) if rewards[True] else None,
            "reward_mean_other": sum(rewards[False]) / len(rewards[False]) if rewards[False] else None}


def write_report(out_dir: Path) -> dict[str, Any]:
    """Plots and ``OUT/summary.json`` from ``OUT/metrics.jsonl`` (and the completions file when written); returns
    the summary."""
    rows = read_metrics(out_dir)
    summary = summarise(rows)
    if (completions := out_dir / COMPLETIONS_FILE).is_file():
        summary["completions"] = summarise_completions(completions)
    summary["plots"] = [str(p.relative_to(out_dir)) for p in write_plots(out_dir, rows)]
    (out_dir / SUMMARY_FILE).write_text(json.dumps(summary, indent=2) + "\n")
    return summary
