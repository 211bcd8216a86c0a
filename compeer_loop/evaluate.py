"""Evaluation of one policy on the valid-split prompts: the evaluator's held-out-turn harness answers every prompt
(greedy, the CER policy prompt), then the shipped trained judge scores each answer over gRPC.

Outputs in ``ROOT/eval/<policy>/``: ``gold/`` (the evaluator's resumable run folder: the policy's raw output, its
``<response>``, ``<strategy>`` name and format validity per prompt), ``scored.jsonl`` (the trained judge's status and
reward components per prompt, resumable), ``records.jsonl`` (both joined, with per-prompt ROUGE-L and length) and
the independent scorer's comparison of each reply with the prompt's real supporter reply (``reference``), in both
orders (``independent_as_a``, ``independent_as_b``, ``independent_win``, ``independent_first_position``,
``independent_status``; :func:`compeer_loop.independent.compare_replies`, cached in ``compared/``),
``esc.json`` (the ESC-Eval-style run's summary, from its resumable folder ``esc/``; ``esc_cards`` > 0) and
``done.json`` (counts). The figures and their bootstrap intervals are computed from ``records.jsonl`` by the report
(:mod:`compeer_loop.stats`), where the metric libraries are installed (the GPU machine lacks nltk and rouge-score).
A prompt the judge could not score keeps its status (``parse_failed``, ``timeout``, ...) and no reward.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from cer.dialogue import Turn
from cer.modes import JudgeMode
from compeer_loop.independent import compare_replies, scorer_spec
from compeer_loop.plan import BASE_POLICY, LoopSettings, judge_servers
from compeer_loop.prompts import CARDS_FILE, EVAL_FILE, read_jsonl
from compeer_loop.runner import load_settings, policy_dir
from evaluator.backends import ROLES, ChatRole, ModelSpec, build_roles, resolve_spec
from evaluator.esc_eval import EscConfig, run_card
from evaluator.esc_eval import summarise as summarise_esc
from evaluator.gold import GoldConfig, run_turn
from evaluator.inputs import GoldTurn, load_cards
from evaluator.prompts import load_prompts
from evaluator.runs import RunDir, run_items
from judge.device import dtype_name, resolve_device_dtype
from judge.model_store import is_named_model, resolve_model
from reward_server.client import RewardCallError, RewardClient
from reward_server.types import ErrorInfo, GroupRequest, ScoreOptions

log = logging.getLogger(__name__)
SCORE_CHUNK = 16


def _dtype(s: LoopSettings) -> str:
    """The policy's weights dtype on ``s.device``: judge.device's ``auto`` (the one rule)."""
    return dtype_name(resolve_device_dtype(s.device, "auto")[1])


def _base_path(s: LoopSettings) -> str:
    """The policy's base folder: ``default`` and base names resolved by the model store, a folder as given."""
    return resolve_model(s.policy_model, _dtype(s)).path if is_named_model(s.policy_model) else s.policy_model


def merged_policy(adapter: Path, base: str, target: Path, dtype: str) -> Path:
    """The arm's LoRA merged into the policy's base weights, saved once to ``target`` (a plain HF folder, so the
    evaluation engine loads no adapter at run time)."""
    if (target / "config.json").is_file():
        return target
    import shutil
    import tempfile

    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(base, dtype=getattr(torch, dtype), local_files_only=True)
    merged = PeftModel.from_pretrained(model, str(adapter), is_trainable=False).merge_and_unload()
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=".merge-"))
    try:
        merged.save_pretrained(tmp)
        AutoTokenizer.from_pretrained(base, local_files_only=True).save_pretrained(tmp)
        tmp.rename(target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def policy_spec(root: Path, s: LoopSettings, name: str) -> ModelSpec:
    """The evaluator's spec of a policy: the base model for ``base``, else the arm's adapter merged into it."""
    if name == BASE_POLICY:
        model = _base_path(s)
    else:
        found = policy_dir(root, name)
        if found is None:
            raise FileNotFoundError(f"policy {name}: no trained adapter under {root / name}")
        target = root / "eval" / name / "merged"
        target.parent.mkdir(parents=True, exist_ok=True)
        model = str(merged_policy(found, _base_path(s), target, _dtype(s)))
    return ModelSpec(model=model, device=s.device, max_tokens=s.eval_max_tokens, temperature=0.0, max_retries=0)


def eval_items(s: LoopSettings) -> list[tuple[str, GoldTurn]]:
    rows = read_jsonl(Path(s.prompts) / EVAL_FILE)[: s.eval_limit]
    return [(r["id"], GoldTurn(r["id"], tuple(Turn.from_dict(t) for t in r["history"]), r["reference"],
                               r["strategy"])) for r in rows]


async def generate(root: Path, s: LoopSettings, name: str, out: Path) -> list[dict[str, Any]]:
    """The policy's answers to every eval prompt (resumable evaluator run in ``out/gold``)."""
    spec = policy_spec(root, s, name)
    items = eval_items(s)
    config = {"policy": name, "identity": resolve_spec(spec).identity, "max_tokens": spec.max_tokens,
              "prompts": [i for i, _ in items]}
    run = RunDir.open(out / "gold", "gold", config)
    roles = build_roles({r: spec for r in ROLES}, run.cache_dir, s.seed)
    prompts, cfg = load_prompts(None), GoldConfig(model_format="cer")
    try:
        return await run_items(run, items, lambda g: run_turn(g, roles, prompts, cfg), s.eval_concurrency,
                               f"eval {name}")
    finally:
        await roles.aclose()


async def esc(root: Path, s: LoopSettings, name: str, out: Path) -> dict[str, Any]:
    """The ESC-Eval-style evaluation of one policy (resumable evaluator run in ``out/esc``): ``esc_rounds`` rounds
    with a simulated seeker on the first ``esc_cards`` cards of the valid dialogues, then 7 dimensions scored 0-4;
    simulator and scorer are the independent scorer's model (``independent_scorer``; the base policy model when that
    is ``none``), named in the summary. Returns the evaluator's summary + identities."""
    cards = load_cards(Path(s.prompts) / CARDS_FILE)[: s.esc_cards]
    spec = policy_spec(root, s, name)
    independent = scorer_spec(s)
    helper = ModelSpec(model=independent.model if independent else _base_path(s), adapter=(
        independent.adapter if independent else None), device=s.device, max_tokens=s.eval_max_tokens, temperature=0.0)
    specs = {"model": spec, "simulator": helper, "scorer": helper}
    identities = {r: resolve_spec(x).identity for r, x in specs.items()}
    cfg = EscConfig(rounds=s.esc_rounds, model_format="cer")
    run = RunDir.open(out / "esc", "esc", {"policy": name, "roles": identities, "harness": cfg.as_dict(),
                                           "cards": [c.id for c in cards]})
    roles = build_roles(specs, run.cache_dir, s.seed)
    prompts = load_prompts(None)
    try:
        records = await run_items(run, [(c.id, c) for c in cards], lambda c: run_card(c, roles, prompts, cfg),
                                  s.eval_concurrency, f"esc {name}")
    finally:
        await roles.aclose()
    return {**summarise_esc(records, prompts), "roles": identities, "rounds": s.esc_rounds}


def _score_fields(outcome: Any) -> dict[str, Any]:
    if isinstance(outcome, ErrorInfo):
        return {"judge_status": "invalid_input", "judge_error": f"{outcome.code} {outcome.field}"}
    r = outcome.results[0]
    steps = [v for v in r.rewards.steps if v is not None]
    graded = r.graded_rewards  # None when the server serves no graded rewards
    return {"judge_status": r.status.value, "reward_total": r.rewards.total,
            "reward_steps": list(r.rewards.steps), "reward_steps_mean": sum(steps) / len(steps) if steps else None,
            "reward_preference": r.rewards.preference, "reward_format": r.rewards.format,
            "reward_total_graded": graded.total if graded is not None else None}


async def score(records: list[dict[str, Any]], address: str, path: Path) -> dict[str, dict[str, Any]]:
    """Trained-judge reward components per answered prompt (one candidate per group), appended to ``path``."""
    done: dict[str, dict[str, Any]] = {r["id"]: r for r in read_jsonl(path)} if path.exists() else {}
    todo = [r for r in records if r.get("status") == "ok" and r["id"] not in done]
    client = RewardClient([address], timeout_s=600.0)
    try:
        for k in range(0, len(todo), SCORE_CHUNK):
            chunk = todo[k:k + SCORE_CHUNK]
            groups = [GroupRequest(history=[Turn.from_dict(t) for t in r["history"]], reference=r["reference"],
                                   candidates=[r["raw"]],
                                   options=ScoreOptions(mode=JudgeMode.UNIFIED, include_similarity=False))
                      for r in chunk]
            try:
                outcomes: list[Any] = await client.score_batch(groups, timeout_s=600.0)
            except RewardCallError as exc:
                log.error("scoring call failed: %s (these prompts stay unscored)", exc.code.name)
                outcomes = [None] * len(chunk)
            with path.open("a", encoding="utf-8") as fh:
                for r, o in zip(chunk, outcomes):
                    row = {"id": r["id"], **(_score_fields(o) if o is not None else {"judge_status": "call_failed"})}
                    done[r["id"]] = row
                    fh.write(json.dumps(row) + "\n")
    finally:
        await client.close()
    return done


@asynccontextmanager
async def scorer_role(s: LoopSettings, out: Path) -> AsyncIterator[ChatRole | None]:
    """The independent scorer (:func:`compeer_loop.independent.scorer_spec`) as a :class:`ChatRole` whose answers
    are cached in ``out/compared`` (a resumable run folder naming the scorer), its engine stopped on exit; None when
    ``independent_scorer`` is ``none``. ``compeer-loop eval`` and ``compeer-loop rescore`` both score through it."""
    spec = scorer_spec(s)
    if spec is None:
        yield None
        return
    run = RunDir.open(out / "compared", "compared", {"scorer": resolve_spec(spec).identity, "adapter": spec.adapter,
                                                     "against": "reference, both orders"})
    roles = build_roles({r: spec for r in ROLES}, run.cache_dir, s.seed)
    try:
        yield roles.scorer
    finally:
        await roles.aclose()


async def compare(records: list[dict[str, Any]], s: LoopSettings, out: Path) -> dict[str, dict[str, Any]]:
    """The independent scorer's comparison of every answered reply with its prompt's real supporter reply, both
    orders (answers cached in ``out/compared``, :func:`scorer_role`; :func:`compeer_loop.independent.compare_replies`);
    empty when ``independent_scorer`` is ``none``."""
    async with scorer_role(s, out) as scorer:
        return {} if scorer is None else await compare_replies(records, scorer, s.eval_concurrency)


DONE_FILE, ESC_FILE = "done.json", "esc.json"


def evaluate_policy(root: Path, name: str) -> dict[str, Any]:
    """Generate, score and join one policy's answers; returns the counts written to ``done.json``."""
    s = load_settings(root)
    out = root / "eval" / name
    out.mkdir(parents=True, exist_ok=True)
    records = asyncio.run(generate(root, s, name, out))
    address = judge_servers(s)["trained"].address
    scores = asyncio.run(score(records, address, out / "scored.jsonl"))
    compared = asyncio.run(compare(records, s, out))
    joined = [{**r, **scores.get(r["id"], {}), **compared.get(r["id"], {})} for r in records]
    with (out / "records.jsonl").open("w", encoding="utf-8") as fh:
        for r in joined:
            fh.write(json.dumps(r, ensure_ascii=False) + "\n")
    statuses = Counter(str(r.get("judge_status")) for r in joined if r.get("status") == "ok")
    counts = {"policy": name, "prompts": len(joined), "answered": sum(1 for r in joined if r.get("status") == "ok"),
              "judge_status": dict(statuses)}
    if s.esc_cards > 0:
        summary = asyncio.run(esc(root, s, name, out))
        (out / ESC_FILE).write_text(json.dumps(summary, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        counts["esc_statuses"] = summary["statuses"]
    (out / DONE_FILE).write_text(json.dumps(counts, indent=2) + "\n")
    return counts
