"""The report's sections on how the arms ran: which judge each GRPO arm was verified to train against (base model,
revision, adapter and its hash; :mod:`compeer_loop.controls`), what that judge gave the fixed probe, which machine
and card ran each arm (:mod:`compeer_loop.placement`), the GPU time and run status, and the training curves.

Everything comes from the loop folder: ``<arm>/judge.json``, ``<arm>/machine.json`` (copied with the arm by
``compeer-loop merge``), ``<arm>/metrics.jsonl`` and ``state.json``. With several seed replicates
(:mod:`compeer_loop.seeds`) every section shows every seed: the judges table gains a seed column and a control line
per seed, the "trained against" cell names each seed's judge (one phrase when all seeds agree), the curves draw a line
per arm per seed (``c s1``), the training movement a row per arm per seed, and the GPU time a part per seed.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from compeer_loop.controls import read_judge_record
from compeer_loop.placement import read_launches, where_ran
from compeer_loop.plan import ARM_BY_NAME, LoopSettings
from compeer_loop.prompts import read_jsonl
from compeer_loop.runner import STATE_FILE
from compeer_loop.seeds import Replicate, seeded


def fmt(value: float | None, spec: str = ".2f") -> str:
    """A report figure: ``value`` formatted by ``spec``, ``n/a`` where there is none."""
    return "n/a" if value is None else format(value, spec)


#: metrics.jsonl key(s) per curve (the first key present is drawn)
CURVES: dict[str, tuple[str, ...]] = {
    "reward": ("reward",),
    "reward_raw": ("compeer/reward_raw_mean",),
    "step_reward": ("compeer/step_reward_mean",),
    "preference_reward": ("compeer/preference_reward_mean",),
    "format_reward": ("compeer/format_reward_mean",),
    "s_in": ("compeer/s_in_mean",),
    "s_hi": ("compeer/s_hi_mean",),
    "completion_length": ("completions/mean_length",),
    "clip_ratio": ("clip_ratio/region_mean",),
    "kl": ("kl",),
    "frac_reward_zero_std": ("frac_reward_zero_std",),
}


def _num(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"


def _judge_id(served: dict[str, Any]) -> str:
    """``MODEL (revision), adapter`` of a served judge; no adapter named: the bare base."""
    adapter = served.get("adapter") or "no adapter (bare base)"
    return f"{served.get('model')} ({served.get('revision')}), {adapter}"


def _trained_against(root: Path, s: LoopSettings) -> dict[str, str]:
    out = {}
    for arm in s.arms:
        if not ARM_BY_NAME[arm].grpo:
            continue
        record = read_judge_record(root / arm)
        out[arm] = ("; ".join(f"{j['server']}: {_judge_id(j['served'])}" for j in record["judges"])
                    if record else "judge not verified (no judge.json)")
    return out


def trained_against(reps: Sequence[Replicate]) -> dict[str, str]:
    """Per GRPO arm, the judge(s) it was verified to train against, one phrase each ("not verified" for an arm
    trained before the loop checked its judges); with several seeds, each seed's (``seed 1: ...``) unless every seed
    that trained the arm names the same."""
    per_seed = [(rep.seed, _trained_against(rep.root, rep.settings)) for rep in reps]
    out = {}
    for arm in dict.fromkeys(a for _, judged in per_seed for a in judged):
        said = [(seed, judged[arm]) for seed, judged in per_seed if arm in judged]
        same = len({phrase for _, phrase in said}) == 1
        out[arm] = said[0][1] if same else "; ".join(f"seed {seed}: {phrase}" for seed, phrase in said)
    return out


def scored_by_training_weights(reps: Sequence[Replicate]) -> list[str]:
    """The GRPO arms whose independent comparisons are not independent of their training signal: the arm was
    verified to train against a bare base (no adapter) whose model is the one the independent scorer ran as, with no
    adapter (its evaluation records' ``independent_scorer``, :mod:`compeer_loop.independent`). The scorer asks
    another question (which of two replies is better) than the judge (UnifiReward's CER judgment), but with the same
    weights: arm (b) against the default ``judge-base`` scorer."""
    out: list[str] = []
    for rep in reps:
        if rep.settings.independent_scorer_adapter not in (None, "", "none"):
            continue
        for arm in rep.settings.arms:
            record = read_judge_record(rep.root / arm) if ARM_BY_NAME[arm].grpo else None
            judges = (record or {}).get("judges", [])
            bare = {j["served"].get("model") for j in judges if not j["served"].get("adapter")}
            path = rep.root / "eval" / arm / "records.jsonl"
            scorers = {r.get("independent_scorer") for r in read_jsonl(path)} if bare and path.exists() else set()
            if arm not in out and bare & scorers:
                out.append(arm)
    return out


def _probe_of(root: Path, arm: str, server: str) -> dict[str, Any] | None:
    record = read_judge_record(root / arm)
    return next((j.get("probe") for j in (record or {}).get("judges", []) if j["server"] == server), None)


def control_line(root: Path, s: LoopSettings) -> str:
    """Whether arm (b)'s judge is the control it says: no adapter, and a probe preference mean unlike the trained
    judge's (taken from the first trained-judge arm with a record)."""
    b = _probe_of(root, "b", "base") if "b" in s.arms else None
    trained_arm = next((a for a in s.arms if "trained" in ARM_BY_NAME[a].judges and _probe_of(root, a, "trained")),
                       None)
    if b is None or trained_arm is None:
        return "Control (b) vs the trained judge: not measured (no probe of both judges in this loop folder)."
    t = _probe_of(root, trained_arm, "trained") or {}
    out, equal = [], 0
    for key, name in (("preference", "preference"), ("graded_preference", "graded preference"),
                      ("total", "total")):
        vb, vt = b.get(key), t.get(key)
        same = vb is not None and vt is not None and abs(vb - vt) < 1e-9
        equal += same
        out.append(f"{name} {_num(vb)} vs {_num(vt)}" + (" (equal)" if same else ""))
    warn = " Every mean is equal: check that (b)'s judge is the untrained one." if equal == len(out) else ""
    return (f"Control (b) vs the trained judge on the probe ({b.get('ok')} candidates scored; (b)'s judge vs "
            f"({trained_arm})'s): " + "; ".join(out) + "." + warn)


def _judge_rows(root: Path, s: LoopSettings, seed: str) -> list[str]:
    """The judges table's rows of one folder; ``seed``: the seed cell with its separator ("" for one folder)."""
    rows = []
    for arm in s.arms:
        where = where_ran(read_launches(root / arm))
        record = read_judge_record(root / arm)
        if not ARM_BY_NAME[arm].grpo or record is None:
            judge = "—" if not ARM_BY_NAME[arm].grpo else "judge not verified (no judge.json)"
            rows.append(f"| {seed}({arm}) | {judge} | — | — | — | — | {where} |")
            continue
        for j in record["judges"]:
            sv, p = j["served"], j.get("probe") or {}
            adapter = sv.get("adapter") or "none (bare base)"
            rows.append(f"| {seed}({arm}) | {j['server']} (`--adapter {j['flag']}`) | {sv.get('model')} "
                        f"({sv.get('revision')}) | {adapter} | {_num(p.get('preference'))} / "
                        f"{_num(p.get('graded_preference'))} | {_num(p.get('total_own'))} / "
                        f"{_num(p.get('total_other'))} | {where} |")
    return rows


def judges_and_machines(reps: Sequence[Replicate]) -> str:
    """One row per arm (per seed, with a seed column, when several): the judge it was verified to train against,
    the probe's means, and where it ran; then (b)'s control line (one per seed)."""
    many = seeded(reps)
    head = ("| " + ("seed | " if many else "") + "arm | judge server | base model (revision) | adapter (hash) | probe: "
            "preference / graded | probe: total, own / other's candidate | ran on (host, GPUs, card) |")
    rows = [head, "|" + "---|" * (8 if many else 7)]
    for rep in reps:
        rows += _judge_rows(rep.root, rep.settings, f"{rep.seed} | " if many else "")
    controls = [(f"Seed {rep.seed}: " if many else "") + control_line(rep.root, rep.settings) for rep in reps]
    return "\n".join([
        ("Each GRPO arm's judge servers were asked for their `Info` before the arm trained and checked against the "
         "plan (base model and pinned revision; adapter none for (b), the shipped adapter's id for the trained judge); "
         "a mismatch stops the arm. The probe: the first warm-up rows, each group the row's own gold-facts CER target "
         "and another dialogue's, against the real supporter turn; discrete means unless marked graded."),
        "", *rows, "", *controls])


def gpu_section(state: dict[str, Any], gpu_log: Path | None, root: Path | None = None) -> str:
    """Driver wall time, the machines (merged folders: one line each), every arm's and evaluation's status; ``root``:
    the loop folder, whose ``eval/<policy>/done.json`` marks an evaluation done that finished after the last
    ``state.json`` was packed (the driver writes the state between polls), and whose ``records.jsonl`` without it
    marks one cut after its records and before its ESC-Eval-style step."""
    machine = state.get("machine") or {}
    where = (f" ({machine.get('hostname')}: {machine.get('gpus')}; judge servers on card "
             f"{(state.get('placement') or {}).get('judge_card')}, arms on "
             f"{', '.join((state.get('placement') or {}).get('arm_cards') or []) or 'the same'})") if machine else ""
    lines = [(f"Driver wall time on the GPU machine{where}: {state.get('elapsed_s', 0):.0f} s (servers, warm-up, arms, "
              "evaluation).")]
    if state.get("parts"):  # `compeer-loop merge`: folders trained on different machines
        lines = [(f"Driver wall time on the GPU machines: {state.get('elapsed_s', 0):.0f} s in all, "
                 f"{len(state['parts'])} loop folders merged (same settings; every GRPO arm from the warm-up with "
                 f"sha256 {str(state.get('warmup_sha256', 'not recorded'))[:12]}):")]
        for p in state["parts"]:
            m = p.get("machine") or {}
            host = f" on {m.get('hostname')} ({m.get('gpus')})" if m else ""
            lines.append(f"- {p['root']}{host}: {p['elapsed_s']:.0f} s; trained {', '.join(p['arms']) or 'nothing'}; "
                         f"evaluated {', '.join(p['eval']) or 'nothing'}")
        lines.append("")
    for name, a in sorted(state.get("arms", {}).items()):
        secs = f", {a['seconds']:.0f} s" if "seconds" in a else ""
        restarts = state.get("restarts", {}).get(name)
        again = f", resumed {restarts} time(s) after a crash" if restarts else ""
        step = f"step {a['step']}/{a.get('max_steps')}" if a.get("step") is not None else f"{a.get('max_steps')} steps"
        ran = f"; ran on {a['ran_on']}" if a.get("ran_on") else ""
        lines.append(f"- arm ({name}): {a.get('status')}, {step}{secs}{again}{ran}")
    for name, e in sorted(state.get("eval", {}).items()):
        out = root / "eval" / name if root is not None else None
        if e != "done" and out is not None and (out / "done.json").is_file():
            e = f"done (finished after the driver last wrote its state: {e} there)"
        elif e != "done" and out is not None and (out / "records.jsonl").is_file():
            e = (f"not finished ({e} when the driver last wrote its state), but its records were written (the figures "
                 "above use them: generation, judge and independent scorer); what follows them (the ESC-Eval-style "
                 "step, when planned) was not")
        lines.append(f"- evaluation of {name}: {e}")
    return "\n".join(lines + gpu_log_lines(gpu_log))


def gpu_log_lines(gpu_log: Path | None) -> list[str]:
    """The GPU calls file quoted (nothing when there is none)."""
    if gpu_log is None or not gpu_log.exists():
        return []
    return ["", "GPU calls (as logged by the lead):", "```", gpu_log.read_text().strip(), "```"]


def gpu_sections(reps: Sequence[Replicate], gpu_log: Path | None) -> str:
    """:func:`gpu_section` of one folder; of several seeds, one part per seed, the GPU calls quoted once after them."""
    states = [json.loads((r.root / STATE_FILE).read_text()) if (r.root / STATE_FILE).exists() else {} for r in reps]
    if not seeded(reps):
        return gpu_section(states[0], gpu_log, reps[0].root)
    parts = [f"**Seed {rep.seed}** (`{rep.root}`): " + gpu_section(st, None, rep.root) for rep, st in zip(reps, states)]
    return "\n".join(["\n\n".join(parts), *gpu_log_lines(gpu_log)])


def _arm_tag(arm: str, seed: int | None) -> str:
    """``(c)``, or ``(c) seed 1`` when the report reads several seeds."""
    return f"({arm})" if seed is None else f"({arm}) seed {seed}"


def arm_logs(reps: Sequence[Replicate], name: str = "metrics.jsonl") -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """Each GRPO arm's JSONL log ``<arm>/<name>`` (default its training metrics; ``completions.jsonl``: its logged
    candidates), tagged as :func:`_arm_tag` (per arm and seed when several seeds); arms without the file are skipped."""
    for rep in reps:
        for arm in rep.settings.arms:
            path = rep.root / arm / name
            if ARM_BY_NAME[arm].grpo and path.exists():
                yield _arm_tag(arm, rep.seed if seeded(reps) else None), read_jsonl(path)


def quarters(reps: Sequence[Replicate], key: str) -> dict[str, tuple[float, float]]:
    """Per GRPO arm (per arm and seed, :func:`_arm_tag`, when several seeds), the mean of a logged metric over the
    first and the last quarter of its steps."""
    out = {}
    for tag, rows in arm_logs(reps):
        ys = [float(r[key]) for r in rows if isinstance(r.get(key), (int, float))]
        if len(ys) >= 2:
            k = max(1, len(ys) // 4)
            out[tag] = (sum(ys[:k]) / k, sum(ys[-k:]) / k)
    return out


def late_slopes(reps: Sequence[Replicate], key: str = "reward", n_boot: int = 2000,
                seed: int = 0) -> dict[str, tuple[float, float, float]]:
    """Per GRPO arm (per arm and seed, as :func:`quarters`), has a logged metric flattened? The least-squares slope per
    step over the second half of the arm's steps, with a 95% bootstrap interval (the steps resampled, seeded): an
    interval holding 0 says the last half's trend is not told from the step-to-step noise; its width says how small a
    trend that noise hides. A step logged twice (an arm resumed from a checkpoint) counts once, with its later value.
    Arms with fewer than 6 steps in that half are left out."""
    out = {}
    rng = np.random.default_rng(seed)
    for tag, rows in arm_logs(reps):
        by_step = {float(r["step"]): float(r[key]) for r in rows  # a resumed arm's later log wins
                   if isinstance(r.get(key), (int, float)) and isinstance(r.get("step"), (int, float))}
        pts = sorted(by_step.items())
        late = np.array(pts[len(pts) // 2:])
        if len(late) < 6:
            continue
        idx = rng.integers(0, len(late), (n_boot, len(late)))
        x, y = late[idx, 0], late[idx, 1]
        xc = x - x.mean(axis=1, keepdims=True)
        with np.errstate(invalid="ignore", divide="ignore"):
            boots = (xc * (y - y.mean(axis=1, keepdims=True))).sum(axis=1) / (xc ** 2).sum(axis=1)
        lo, hi = np.nanquantile(boots, [0.025, 0.975])
        out[tag] = (float(np.polyfit(late[:, 0], late[:, 1], 1)[0]), float(lo), float(hi))
    return out


def write_curves(reps: Sequence[Replicate], out: Path) -> list[str]:
    """One PNG per curve, a line per GRPO arm (per arm and seed, labelled ``c s1``, when several seeds); curves no
    arm logged are left out."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    many = seeded(reps)
    metrics = {(f"{a} s{rep.seed}" if many else f"({a})"): read_jsonl(rep.root / a / "metrics.jsonl")
               for rep in reps for a in rep.settings.arms
               if ARM_BY_NAME[a].grpo and (rep.root / a / "metrics.jsonl").exists()}
    written = []
    for name, keys in CURVES.items():
        fig, ax = plt.subplots(figsize=(6.5, 3.6))
        drawn = 0
        for label, rows in metrics.items():
            key = next((k for k in keys if any(k in r for r in rows)), None)
            pts = [(r["step"], r[key]) for r in rows if key and isinstance(r.get(key), (int, float))
                   and math.isfinite(float(r[key]))]
            if pts:
                ax.plot(*zip(*pts), marker="o", markersize=2, label=label)
                drawn += 1
        if drawn:
            ax.set_xlabel("GRPO step")
            ax.set_title(f"{name} ({keys[0]})")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
            fig.tight_layout()
            fig.savefig(out / f"curves_{name}.png", dpi=100)
            written.append(f"curves_{name}.png")
        plt.close(fig)
    return written
