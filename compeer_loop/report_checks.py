"""The report's sections that a skeptic asks for (issue 26, item 4), from the same evaluation records as the main
table: strategy choice beside the majority-strategy baseline and Cohen's kappa, degenerate and repeated replies, the
training judge's total among format-valid replies only, distinct-n on the first tokens beside the full reply, a
constant generic reply as a control row, the independent scorer's win share against the real reply, and paired
comparisons between arms (seeds pooled, the seed-to-seed spread beside them; with several seeds each seed's own too),
and the issue's goals checked against all of these (:func:`goals`)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from compeer_loop.plan import JUDGE_BASE
from compeer_loop.replies import CONSTANT_REPLY, mark_counts, top_reply_share
from compeer_loop.report_groups import FLAT_STD
from compeer_loop.stats import MATCHED_LENGTH, PER_PROMPT, disjoint, paired_difference, per_prompt, seed_spread
from evaluator.metrics import bleu2, distinct_n, rouge_l

Figures = dict[str, dict[str, Any]]
#: arm pairs compared (first minus second), where both were evaluated
PAIRS = (("c", "a"), ("c", "b"), ("d", "a"), ("e", "a"), ("c", "e"), ("d", "e"), ("c", "f"))
PAIRED_KEYS = ("strategy_correct", "rouge_l", "reward_total", "reward_total_format_ok", "independent_win")
#: the scores compared within each seed too when the report reads several seeds
PER_SEED_KEYS = ("strategy_correct", "reward_total", "independent_win")
NOT_VERIFIED = "judge not verified"


def _v(f: dict[str, Any] | None, digits: int = 2) -> str:
    if not f or f.get("value") is None:
        return "n/a"
    if f.get("lo") is None:
        return f"{f['value']:.{digits}f}"
    return f"{f['value']:.{digits}f} [{f['lo']:.{digits}f}, {f['hi']:.{digits}f}]"


def constant_row(records: list[dict[str, Any]]) -> dict[str, float | None]:
    """BLEU-2, ROUGE-L and distinct-1/2 of :data:`CONSTANT_REPLY` given for every answered prompt of ``records``."""
    refs = [r["reference"] for r in records if r.get("status") == "ok"]
    hyps = [CONSTANT_REPLY] * len(refs)
    return {"bleu_2": bleu2(hyps, refs), "rouge_l": rouge_l(hyps, refs), "distinct_1": distinct_n(hyps, 1),
            "distinct_2": distinct_n(hyps, 2), "prompts": len(refs)}


def skeptic_table(figs: Figures, records: dict[str, list[dict[str, Any]]], labels: dict[str, str],
                  verified: dict[str, bool], first_n: int) -> str:
    """One row per policy: strategy accuracy, majority baseline, kappa, degenerate share (beside the same rule's share
    of the real supporter replies at those prompts) and top-reply share, judge
    total (all judged / format-valid only), distinct-n full and on the first ``first_n`` tokens, the independent
    scorer's win share against the real reply (all replies, and those of about the real reply's length with their
    share) with the share of its answers naming the first position and the share of replies not scored. ``verified``: per GRPO arm, whether its judge was verified (``judge.json``)."""
    head = ("| policy | strategy acc. % | majority baseline % | kappa | degenerate % (the real replies') "
            "| most frequent reply % "
            f"| judge total (all judged) | judge total (format-valid only) | D-1 / D-1 first {first_n} "
            f"| D-2 / D-2 first {first_n} | independent: win share vs the real reply "
            f"| independent: win share, length {MATCHED_LENGTH[0]:g}-{MATCHED_LENGTH[1]:g}x the real reply's "
            "(replies so %) | independent: answers naming A % / not scored % |")
    rows = [head, "|" + "---|" * 13]
    for name, summary in figs.items():
        f = summary["figures"]
        label = labels[name] + (f" ({NOT_VERIFIED})" if verified.get(name) is False else "")
        rows.append(f"| {label} | {_v(f.get('strategy_accuracy'))} | {_v(f.get('majority_baseline'))} | "
                    f"{_v(f.get('strategy_kappa'), 3)} | {_v(f.get('degenerate'))} ({_v(f.get('reference_degenerate'))}) | "
                    f"{_v(f.get('top_reply_share'))} | "
                    f"{_v(f.get('reward_total'))} | {_v(f.get('reward_total_format_ok'))} | "
                    f"{_v(f.get('distinct_1'))} / {_v(f.get('distinct_1_first'))} | "
                    f"{_v(f.get('distinct_2'))} / {_v(f.get('distinct_2_first'))} | "
                    + (f"{_v(f.get('independent_win_share'))} | {_v(f.get('independent_win_share_matched'))} "
                       f"({_v(f.get('independent_matched_share'), 1)}) | "
                       f"{_v(f.get('independent_first_position'), 1)} / {_v(f.get('independent_unscored'), 1)}"
                       if _compared(f) else "not run | not run | not run") + " |")
    return "\n".join(rows)


def replies_lines(records: dict[str, list[dict[str, Any]]], labels: dict[str, str]) -> list[str]:
    """Per policy: its most frequent reply and share, how many replies each degenerate rule marked, and the
    strategies its replies name (a policy that names one strategy for every prompt has collapsed onto it)."""
    out = []
    for name, rs in records.items():
        answered = [r for r in rs if r.get("status") == "ok"]
        share, reply = top_reply_share([r["text"] for r in answered])
        marks = ", ".join(f"{k} {v}" for k, v in sorted(mark_counts(rs).items(), key=lambda x: -x[1]))
        shown = " ".join(str(reply).split())[:120]
        named = Counter(str(r.get("strategy") or "none") for r in answered).most_common(3)
        strategies = ", ".join(f"{k} {100.0 * v / len(answered):.1f}%" for k, v in named) if answered else "n/a"
        out.append(f"- {labels[name]}: most frequent reply ({share or 0:.1f}% of {len(answered)}): \"{shown}\"; "
                   f"marks: {marks}; strategies named (top 3): {strategies}")
    return out


def paired_section(records: dict[str, list[dict[str, Any]]], n_boot: int = 2000,
                   seed: int = 0) -> tuple[str, dict[str, Any]]:
    """Paired comparisons of :data:`PAIRS` on :data:`PAIRED_KEYS` (Markdown, and the figures for figures.json), seeds
    pooled: a pair is one prompt under one seed, each record's seed its ``seed`` (a record without one: ``seed``,
    the one folder's plan seed, which also seeds the resampling). With several seeds, also each seed's own paired
    comparisons on :data:`PER_SEED_KEYS` (``per_seed``: ``"a-b:key" -> seed -> figure``) and their table."""
    scores = {p: {k: per_prompt(rs, k, seed) for k in PAIRED_KEYS} for p, rs in records.items()}
    seeds = sorted({int(r.get("seed", seed)) for rs in records.values() for r in rs})
    rows = ["| comparison | score | pairs (prompt x seed) | mean difference [paired bootstrap 95%] | permutation p |",
            "|---|---|---|---|---|"]
    per_rows = ["| comparison | score | seed | pairs | mean difference [paired bootstrap 95%] | permutation p |",
                "|---|---|---|---|---|---|"]
    out: dict[str, Any] = {"pairs": {}, "seed_spread": {}}
    per_seed: dict[str, dict[int, dict[str, Any]]] = {}
    for a, b in PAIRS:
        if a not in scores or b not in scores:
            continue
        for key in PAIRED_KEYS:
            d = paired_difference(scores[a][key], scores[b][key], n_boot=n_boot, n_perm=n_boot, seed=seed)
            if d["n"] < 2:
                continue
            out["pairs"][f"{a}-{b}:{key}"] = d
            rows.append(f"| ({a}) - ({b}) | {key} | {d['n']} | {_diff(d)} | {d['p']:.4f} |")
            for sd in seeds if len(seeds) > 1 and key in PER_SEED_KEYS else []:
                sa, sb = ({k: v for k, v in scores[p][key].items() if k[0] == sd} for p in (a, b))
                ds = paired_difference(sa, sb, n_boot=n_boot, n_perm=n_boot, seed=seed)
                if ds["n"] >= 2:
                    per_seed.setdefault(f"{a}-{b}:{key}", {})[sd] = ds
                    per_rows.append(f"| ({a}) - ({b}) | {key} | {sd} | {ds['n']} | {_diff(ds)} | {ds['p']:.4f} |")
    spread = ["| policy | score | per-seed means | std of per-seed means |", "|---|---|---|---|"]
    for p, by_key in scores.items():
        for key in PAIRED_KEYS:
            if not by_key[key]:
                continue
            sp = seed_spread(by_key[key])
            out["seed_spread"][f"{p}:{key}"] = sp
            means = ", ".join(f"seed {s}: {m:.2f}" for s, m in sp["seed_means"].items())
            spread.append(f"| {p} | {key} | {means} | "
                          + ("n/a (one seed)" if sp["std"] is None else f"{sp['std']:.2f}") + " |")
    text = "\n".join([
        ("Per-prompt scores (" + ", ".join(f"`{k}`" for k in PER_PROMPT if k in PAIRED_KEYS) + "; strategy_correct "
         "is 100 or 0; independent_win is 1, 0.5 or 0, where the independent scorer's comparison is ok) of two arms "
         "on the prompts both answered, seeds pooled (a pair is one prompt under one seed). "
         f"Interval: the pairs resampled with replacement ({n_boot} times); p: two-sided sign-flip permutation test "
         f"({n_boot} flips). An interval that holds 0 says the arms are not told apart on that score."),
        "", *rows, "", "Seed-to-seed spread (the standard deviation of each policy's per-seed mean):", "", *spread])
    if len(seeds) > 1:
        out["seeds"], out["per_seed"] = seeds, per_seed
        text += "\n".join(["", "", "### Paired comparisons per seed",
                           (f"The same comparisons within each seed alone ({', '.join(map(str, seeds))}; a pair is one "
                            "prompt), for " + ", ".join(f"`{k}`" for k in PER_SEED_KEYS) + ": a goal met \"in each "
                            "seed\" needs every seed's interval to exclude 0."), "", *per_rows])
    return text, out


def _diff(d: dict[str, Any]) -> str:
    return f"{d['diff']:.2f} [{d['lo']:.2f}, {d['hi']:.2f}]"


def _compared(f: dict[str, Any]) -> bool:
    """Whether a policy's figures hold the independent scorer's comparisons (its not-scored share exists)."""
    return (f.get("independent_unscored") or {}).get("value") is not None


def shared_weights_line(arms: Sequence[str]) -> str:
    """The caveat for arms the independent scorer is not independent of (``""`` when none):
    :func:`compeer_loop.report_runs.scored_by_training_weights`."""
    if not arms:
        return ""
    names = ", ".join(f"({a})" for a in arms)
    return (f" The independent scorer is not independent for {names}: trained against the bare base judge, whose "
            "weights the scorer also runs (bare, another prompt: which of two replies is better, not UnifiReward's "
            "judgment), so "
            f"{names}'s win share may be raised by its training signal; compare it with that in mind.")


def independent_section(figs: Figures, scorer: str | None, shared: Sequence[str] = (),
                        records: dict[str, list[dict[str, Any]]] | None = None) -> str:
    """The independent scorer: who it was and how it scores, or that it was not run for this loop folder;
    ``shared``: the arms trained against the scorer's own weights (:func:`shared_weights_line`); ``records``: the
    evaluation records, for the training judge against the scorer (:func:`judge_against_scorer`)."""
    ran = [p for p, s in figs.items() if _compared(s["figures"])]
    if not ran:
        return ("Not run for this loop folder: its evaluations hold no comparison by the independent scorer "
                "(`independent_scorer`, not the training judge; evaluated before the scorer existed, or before it "
                "compared replies instead of rating them 1-5), so its columns read `not run`. Every judge score in "
                "this report is the training judge's own (circular for the arms trained against it).")
    return (f"Independent scorer: `{scorer}`, zero-shot. It compares each reply with the real ESConv supporter reply "
            "of the same prompt, asked twice (the reply as A, then as B; one line `Better: A` or `Better: B`): win 1 "
            "when the reply won both orders, 0.5 when the orders split, 0 when it lost both. The win share is the mean "
            "win over the replies scored (0.5: level with the real reply on average); a reply whose answers did not parse, or whose scorer call failed, is counted as not scored, never "
            "given a win. Answers naming A: far from 50% is position bias, which the two orders cancel in the win "
            "but which leaves fewer decisive pairs. " + _scorer_check_line(scorer) + " Compared: " + ", ".join(ran)
            + "." + shared_weights_line(shared) + judge_against_scorer(records or {}))


def judge_against_scorer(records: dict[str, list[dict[str, Any]]], base: str = "a") -> str:
    """Does the training judge's preference between an arm's reply and the warm-up's (``base``) on the same prompt
    agree with the independent scorer's? Per policy other than ``base``, on the prompt x seed pairs both were judged
    and scored: how often the judge's total puts the arm higher, level or lower, the scorer's mean win difference
    (arm - ``base``) in each of those three sets, and the share of pairs both told apart where the scorer's direction
    is the judge's; a second row with the graded total where the records carry it (level: within
    :data:`compeer_loop.report_groups.FLAT_STD`, the judge-flat rule). Empty without ``base`` or another policy
    scored by both."""
    if base not in records:
        return ""
    rows = []
    for p in (p for p in records if p != base):
        for key, label, level in (("reward_total", "", 0.0), ("reward_total_graded", ", graded", FLAT_STD)):
            row = _agreement_row(records[p], records[base], key, level)
            if row:
                rows.append(f"| ({p}) - ({base}){label} | {row} |")
    if not rows:
        return ""
    return "\n".join(["", "", (f"The training judge against the independent scorer, each arm against ({base}) on the same "
                     "prompt: how often the judge's total puts the arm's reply higher, level or lower, with the "
                     "scorer's mean win difference (arm - warm-up) in each set; then the share of the pairs both "
                     "told apart where the scorer sides with the judge (50%: no better than a coin):"), "",
                      ("| comparison | pairs | judge: arm higher, n (scorer's win diff.) | level | lower | scorer sides "
                       "with the judge % (pairs both told apart) |"), "|---|---|---|---|---|---|", *rows])


def _agreement_row(arm: list[dict[str, Any]], base: list[dict[str, Any]], key: str, level: float) -> str:
    """One row's cells of :func:`judge_against_scorer` on the judge's ``key`` total ('' when no pair has it)."""
    judge_p, judge_b = per_prompt(arm, key), per_prompt(base, key)
    win_p, win_b = per_prompt(arm, "independent_win"), per_prompt(base, "independent_win")
    keys = sorted(set(judge_p) & set(judge_b) & set(win_p) & set(win_b))
    if not keys:
        return ""
    sets: dict[str, list[float]] = {"higher": [], "level": [], "lower": []}
    agree = decisive = 0
    for k in keys:
        dj, dw = judge_p[k] - judge_b[k], win_p[k] - win_b[k]
        side = "level" if abs(dj) <= level else "higher" if dj > 0 else "lower"
        sets[side].append(dw)
        if side != "level" and dw != 0:
            decisive += 1
            agree += (dj > 0) == (dw > 0)
    cells = [f"{len(v)} ({f'{sum(v) / len(v):+.2f}' if v else 'n/a'})" for v in sets.values()]
    share = f"{100 * agree / decisive:.1f} ({decisive})" if decisive else "n/a"
    return f"{len(keys)} | {' | '.join(cells)} | {share}"


def _scorer_check_line(scorer: str | None) -> str:
    """What the check on valid contrast groups says of this scorer (it measured ``judge-base``, the bare 1.5B)."""
    if scorer == JUDGE_BASE:
        return ("The scorer was checked on valid contrast groups (docs/evaluations/compeer-loop/scorer-check/): it "
                "ranks the real reply above worse kinds but echoes and is weak.")
    return (f"The check on valid contrast groups in docs/evaluations/compeer-loop/scorer-check/ measured `{JUDGE_BASE}` "
            f"(the bare 1.5B), not `{scorer}`: this scorer's own check, where one was run, is in that folder.")


def judge_verified(root: Path, arms: list[str], grpo: dict[str, bool]) -> dict[str, bool]:
    """Per GRPO arm, whether ``ROOT/<arm>/judge.json`` (:mod:`compeer_loop.controls`) exists."""
    from compeer_loop.controls import JUDGE_FILE

    return {a: (root / a / JUDGE_FILE).exists() for a in arms if grpo.get(a)}


def figure_of(figs: dict[str, dict[str, Any]], policy: str, key: str) -> dict[str, Any] | None:
    """A policy's figure ``key`` (value and interval), None when it was not measured."""
    f = figs.get(policy, {}).get("figures", {}).get(key)
    return f if f and f.get("value") is not None else None


#: a figure of the arms table -> its per-prompt score in the paired comparisons (``report_checks.paired_section``)
PAIRED_OF = {"strategy_accuracy": "strategy_correct", "reward_total": "reward_total",
             "independent_win_share": "independent_win"}


def beats(figs: dict[str, dict[str, Any]], a: str, b: str, key: str,
           paired: dict[str, dict[str, Any]] | None = None) -> str:
    """Whether ``a`` beats ``b`` on ``key``: by the paired 95% interval of ``a - b`` over the prompts both answered
    (seeds pooled) when the paired comparisons have it, else by non-overlapping per-arm intervals (said so)."""
    d = (paired or {}).get(f"{a}-{b}:{PAIRED_OF.get(key, key)}")
    if d is not None and d.get("lo") is not None:
        where = f"paired 95% interval [{d['lo']:.2f}, {d['hi']:.2f}], {d['n']} pairs, permutation p {d['p']:.4f}"
        if d["lo"] > 0:
            return f"met: ({a}) - ({b}) = {d['diff']:.2f}, {where}: excludes 0"
        return f"missed: ({a}) - ({b}) = {d['diff']:.2f}, {where}: does not exclude 0 from below"
    fa, fb = figure_of(figs, a, key), figure_of(figs, b, key)
    if fa is None or fb is None:
        return f"not measured (no {key} for ({a if fa is None else b}))"
    diff = fa["value"] - fb["value"]
    sep = disjoint(fa, fb)
    if sep:
        return f"met: ({a}) {fa['value']:.2f} vs ({b}) {fb['value']:.2f}, intervals do not overlap (no paired figure)"
    if diff > 0:
        return (f"missed: ({a}) is higher by {diff:.2f} but the 95% intervals overlap "
                f"([{fa['lo']:.2f}, {fa['hi']:.2f}] vs [{fb['lo']:.2f}, {fb['hi']:.2f}]; no paired figure)")
    return f"missed: ({a}) {fa['value']:.2f} is not above ({b}) {fb['value']:.2f} (by {-diff:.2f})"


def beats_in_each_seed(figs: Figures, a: str, b: str, key: str, paired: dict[str, dict[str, Any]] | None,
                       per_seed: dict[str, dict[int, dict[str, Any]]] | None, seeds: list[int]) -> str:
    """Whether ``a`` beats ``b`` on ``key`` in each seed: met only when the paired 95% interval of ``a - b`` lies above
    0 within every one of ``seeds`` (each seed's interval printed, and the pooled one after them). With one
    seed, or no per-seed figure at all (e.g. the score was not measured): :func:`beats`."""
    runs = (per_seed or {}).get(f"{a}-{b}:{PAIRED_OF.get(key, key)}") or {}
    if len(seeds) < 2 or not runs:
        return beats(figs, a, b, key, paired)
    parts, excluded = [], 0
    for sd in seeds:
        d = runs.get(sd)
        if d is None or d.get("lo") is None:
            parts.append(f"seed {sd}: not measured")
            continue
        excluded += d["lo"] > 0
        parts.append(f"seed {sd}: {_diff(d)} ({d['n']} pairs, p {d['p']:.4f})")
    pooled = (paired or {}).get(f"{a}-{b}:{PAIRED_OF.get(key, key)}")
    both = "" if pooled is None else f"; seeds pooled: {_diff(pooled)} ({pooled['n']} pairs, p {pooled['p']:.4f})"
    verdict = "met" if excluded == len(seeds) else "missed"
    return (f"{verdict}: the paired 95% interval of ({a}) - ({b}) lies above 0 in {excluded} of {len(seeds)} seeds "
            f"({'; '.join(parts)}{both})")


def goals(figs: dict[str, dict[str, Any]], paired: dict[str, dict[str, Any]] | None = None,
          per_seed: dict[str, dict[int, dict[str, Any]]] | None = None, seeds: Sequence[int] = ()) -> list[str]:
    """The issue's goals, each stated as met or missed from the figures; ``paired``: the paired comparisons
    (``report_checks.paired_section``'s ``pairs``), which decide a "beats" goal wherever they have it; ``per_seed``
    and ``seeds`` (several seeds): the paired comparisons within each seed, which decide the goals "(c) beats (a)/(b)
    on the independent scorer" (met only when met in each seed)."""
    out = [f"(c) beats (a) on strategy accuracy: {beats(figs, 'c', 'a', 'strategy_accuracy', paired)}",
           f"(c) beats (b) on strategy accuracy: {beats(figs, 'c', 'b', 'strategy_accuracy', paired)}",
           f"(c) beats (a) on the trained judge's reward: {beats(figs, 'c', 'a', 'reward_total', paired)}",
           f"(c) beats (b) on the trained judge's reward: {beats(figs, 'c', 'b', 'reward_total', paired)}"]
    c2, a2 = figure_of(figs, "c", "distinct_2"), figure_of(figs, "a", "distinct_2")
    if c2 and a2:
        verdict = "met" if c2["value"] >= a2["value"] else f"missed by {a2['value'] - c2['value']:.2f}"
        out.append(f"distinct-2 of (c) not below (a)'s: {verdict} ({c2['value']:.2f} vs {a2['value']:.2f})")
    else:
        out.append("distinct-2 of (c) not below (a)'s: not measured")
    for arm in ("d", "e"):  # the other trained-judge arms against the warm-up they started from
        out.append(f"({arm}) beats (a) on strategy accuracy: {beats(figs, arm, 'a', 'strategy_accuracy', paired)}")
        out.append(f"({arm}) beats (a) on the trained judge's reward: "
                   f"{beats(figs, arm, 'a', 'reward_total', paired)}")
    for arm in ("c", "d"):
        out.append(f"reweighting ({arm}) raises distinct-2 over no reweighting (e): "
                   f"{beats(figs, arm, 'e', 'distinct_2')}")
    if "f" in figs:
        out.append(f"unified (c) vs PRM + ORM (f), trained judge's reward: "
                   f"{beats(figs, 'c', 'f', 'reward_total', paired)}; "
                   f"strategy accuracy: {beats(figs, 'c', 'f', 'strategy_accuracy', paired)}")
    else:
        out.append("unified (c) vs PRM + ORM (f): (f) was not evaluated (see the run status below)")
    # issue 26's goals: the independent scorer, strategy kappa, degenerate replies (seeds pooled)
    for other in ("a", "b"):
        out.append(f"(c) beats ({other}) on the independent scorer: "
                   f"{beats_in_each_seed(figs, 'c', other, 'independent_win_share', paired, per_seed, list(seeds))}")
    kc, ka = figure_of(figs, "c", "strategy_kappa"), figure_of(figs, "a", "strategy_kappa")
    if kc is None or ka is None:
        out.append("strategy kappa of (c) >= 0.15 and above (a)'s: not measured")
    else:
        ok = kc["value"] >= 0.15 and kc["value"] > ka["value"]
        out.append(f"strategy kappa of (c) >= 0.15 and above (a)'s: {'met' if ok else 'missed'} "
                   f"({kc['value']:.3f} vs (a) {ka['value']:.3f})")
    deg = {p: f["value"] for p in sorted(figs) if (f := figure_of(figs, p, "degenerate")) is not None}
    if deg:
        worst = max(deg, key=deg.__getitem__)
        ref = figure_of(figs, worst, "reference_degenerate")  # the same rule on the real replies, same prompts
        beside = "" if ref is None else f"; the rule marks {ref['value']:.1f}% of the real supporter replies there"
        out.append(f"degenerate replies < 2% in every arm: {'met' if deg[worst] < 2.0 else 'missed'} (highest: "
                   f"({worst}) {deg[worst]:.1f}%{beside})")
    else:
        out.append("degenerate replies < 2% in every arm: not measured")
    return out
