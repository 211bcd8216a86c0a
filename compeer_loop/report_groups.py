"""The report's "where the advantage came from" table: in the rollout groups where the judge gave every candidate the
same total, did the trained reward still vary, and what did that variation favour?

GRPO normalises each group's rewards by the group's spread, so a group whose spread comes only from the redundancy
reweighting (paper Eq.5-7: the judge's reward divided by ``(1 + tau s_in)(1 + tau s_hi)``, :mod:`cer.redundancy`)
pushes the policy as hard as a group the judge told apart, towards whatever the factor favours: the candidate least
similar to its siblings (``s_in``) and to the conversation (``s_hi``). Read from each GRPO arm's
``<arm>/completions.jsonl`` (``log_completions_file``: one line per candidate with ``call``, ``group``, the reward
used, the judge's ``total`` / ``graded_total`` and ``s_in`` / ``s_hi``); an arm without the file is left out.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import numpy as np
from scipy.stats import spearmanr

from cer.reasoning import reply_text
from compeer_loop.report_runs import arm_logs, fmt
from compeer_loop.seeds import Replicate
from data_builder.policy_negatives import COMPLETIONS_FILE

#: a group whose judge totals spread less than this (standard deviation) counts as one the judge did not tell apart
FLAT_STD = 0.05
#: below this spread of the reward used, a judge-flat group is taken to favour no candidate
PUSH_STD = 1e-3
#: what TRL adds to a group's standard deviation before dividing by it (GRPOTrainer, scale_rewards='group')
TRL_STD_EPS = 1e-4


def judge_total(r: dict[str, Any]) -> float:
    """The judge's total of a candidate before any reweighting: the graded total where logged, else the discrete."""
    g = r.get("graded_total")
    return float(g if g is not None else r["total"])


def scored_groups(rows: Sequence[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """An arm's logged candidates as rollout groups: those of one ``(step, call, group)`` whose reward call was ok, with
    a reward and a judge total; groups of 2 or more only (in log order)."""
    groups: dict[tuple[Any, Any, Any], list[dict[str, Any]]] = defaultdict(list)
    for r in rows:  # a resumed arm numbers its reward calls from 1 again: the step keeps its groups apart
        if r.get("status") == "ok" and r.get("reward") is not None and r.get("total") is not None:
            groups[(r.get("step"), r.get("call"), r.get("group"))].append(r)
    return [g for g in groups.values() if len(g) > 1]


def _words(text: str) -> int:
    """Words in a candidate's reply (its ``<response>`` part, else the tag-stripped output: cer.reasoning.reply_text)."""
    return len(reply_text(text)[0].split())


def _mean_abs_advantage(group: Sequence[dict[str, Any]]) -> float:
    """The mean |advantage| TRL gives a group's candidates under ``scale_rewards='group'``: (reward - group mean) /
    (the group's standard deviation with Bessel's correction + 1e-4)."""
    used = np.array([float(r["reward"]) for r in group])
    return float(np.mean(np.abs(used - used.mean())) / (used.std(ddof=1) + TRL_STD_EPS))


def flat_group_figures(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """For one arm's logged candidates: ``groups`` (scored groups of 2 or more), ``flat_share`` (of those, the share
    whose judge totals spread less than :data:`FLAT_STD`), ``flat_reward_std`` (the mean spread of the reward used in
    those groups: 0 when nothing but the judge sets it), ``rho_s_hi`` (mean Spearman rho, within those groups, of
    ``s_hi`` with the reward used; None without ``s_hi``), ``flat_advantage`` / ``all_advantage`` (the mean
    |advantage| TRL gives a candidate, :func:`_mean_abs_advantage`, in those groups and in all) and
    ``words_favoured`` / ``words_others`` / ``pushed`` (reply words of the candidate the reward used ranks first in
    the flat groups it spreads by more than :data:`PUSH_STD`, the mean of the others, and how many such groups).
    A group is the candidates of one ``(step, call, group)`` (:func:`scored_groups`)."""
    scored = scored_groups(rows)
    flat = [g for g in scored if float(np.std([judge_total(r) for r in g])) < FLAT_STD]
    rhos, favoured, others, spreads = [], [], [], []
    for g in flat:
        used = np.array([float(r["reward"]) for r in g])
        spreads.append(float(np.std(used)))
        if all(r.get("s_hi") is not None for r in g):
            s_hi = [float(r["s_hi"]) for r in g]
            if np.std(s_hi) > 0 and np.std(used) > 0:
                rhos.append(float(spearmanr(s_hi, used)[0]))
        if np.std(used) > PUSH_STD:  # a group with no push favours no candidate
            words = [_words(str(r.get("text", ""))) for r in g]
            top = int(np.argmax(used))
            favoured.append(words[top])
            others.append(float(np.mean(words[:top] + words[top + 1:])))
    mean = (lambda xs: float(np.mean(xs)) if xs else None)
    return {"groups": len(scored), "flat": len(flat), "flat_share": len(flat) / len(scored) if scored else None,
            "flat_reward_std": mean(spreads), "rho_s_hi": mean(rhos), "words_favoured": mean(favoured),
            "flat_advantage": mean([_mean_abs_advantage(g) for g in flat]),
            "all_advantage": mean([_mean_abs_advantage(g) for g in scored]), "pushed": len(favoured),
            "words_others": mean(others)}


def flat_groups_section(reps: Sequence[Replicate]) -> list[str]:
    """The table (a row per GRPO arm, per seed when several) with its explanation; no lines when no arm logged its
    completions."""
    rows = []
    for tag, logged in arm_logs(reps, COMPLETIONS_FILE):
        f = flat_group_figures(logged)
        share = None if f["flat_share"] is None else 100 * f["flat_share"]
        rows.append(f"| {tag} | {f['groups']} | {fmt(share, '.1f')} ({f['flat']}) | "
                    f"{fmt(f['flat_reward_std'], '.3f')} | {fmt(f['flat_advantage'], '.3f')} "
                    f"({fmt(f['all_advantage'], '.3f')}) | {fmt(f['rho_s_hi'], '+.2f')} | "
                    f"{fmt(f['words_favoured'], '.1f')} / {fmt(f['words_others'], '.1f')} ({f['pushed']}) |")
    if not rows:
        return []
    return ["", ("Where the advantage came from. GRPO scales each rollout group by its own spread (TRL's default "
                 "`scale_rewards='group'`), so a group the judge did not tell apart (its totals' standard deviation < "
                 f"{FLAT_STD}) still moves the policy as much as any other when the redundancy reweighting gives it a "
                 "spread. In those groups: the spread of the reward used (0: no push), the mean |advantage| TRL gives "
                 "a candidate there (in all groups), its rank correlation with the "
                 "candidate's similarity to the conversation (`s_hi`; negative: the least on-topic candidate is "
                 "favoured) and the reply words of the favoured candidate against the others':"), "",
            ("| arm | groups | judge-flat groups % (n) | reward spread there | mean abs. advantage there (all groups) | "
             "rho(s_hi, reward) there | words, favoured / others (groups it spreads) |"), "|---|---|---|---|---|---|---|", *rows]
