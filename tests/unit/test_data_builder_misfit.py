"""Policy-made misfits (issue 23, after issue 26's loop): a reply whose named strategy belongs to another support
stage than the round's annotated one is marked by ``policy-negatives --stage-misfit``, paired against the real reply
in the silver items (step 3 naming the policy's strategy, False) and measured as its own contrast kind; rounds the
file holds no misfit for keep their preference pairs and contrast candidates."""

from __future__ import annotations

import lzma
from pathlib import Path

from cer.reasoning import PARTS, parse, render
from cer.taxonomy import load_taxonomy
from data_builder.cli import main
from data_builder.contrast import build_contrast
from data_builder.negatives import POLICY_MISFIT, PolicyPool
from data_builder.policy_negatives import Labeller
from data_builder.records import read_jsonl, write_jsonl
from data_builder.silver import build_silver
from data_builder.silver_text import load_config


def _raw(strategy: str, reply: str) -> str:
    return render({"analysis": "Issue: work.", "emotion": "sadness", "strategy": f"{strategy}, because it fits.",
                   "response": reply})


def _labeller(stage_misfit: bool = True) -> Labeller:
    return Labeller(load_config(), load_taxonomy(), stage_misfit=stage_misfit)


def test_stage_misfit_marks_a_named_strategy_of_another_stage_only() -> None:
    lab, history = _labeller(), [{"role": "seeker", "text": "My boss fired me today and I feel awful."}]
    text = "What happened at work after your boss told you?"
    question = _raw("Question", text)
    assert lab.label(text, history, question, True, "Affirmation and Reassurance") == ("misfit", "stage_misfit")
    assert lab.named_misfit(question, "Providing Suggestions") == "Question"
    # the same stage (exploration), the same strategy, no annotation, a malformed output: not a misfit
    assert lab.label(text, history, question, True, "Restatement or Paraphrasing") is None
    assert lab.label(text, history, question, True, "Question") is None
    assert lab.label(text, history, question, True, None) is None
    assert lab.label(text, history, f"<response>{text}</response>", False, "Affirmation and Reassurance") is None
    # Others has no stage of its own: never a misfit either way
    assert lab.label(text, history, question, True, "Others") is None
    # off by default (the loop's degenerate count and the earlier rounds' files use the default labeller)
    assert _labeller(False).label(text, history, question, True, "Affirmation and Reassurance") is None
    # the other rules come first: a stage label stays degenerate
    frag = "I would place this in the comforting stage."
    assert lab.label(frag, history, _raw("Question", frag), True, "Affirmation and Reassurance")[0] == "degenerate"


def _misfit_folder(root: Path, rounds: list[dict], strategies: list[str]) -> Path:
    """A compeer-loop folder whose policy names ``strategies`` (one per round) with a question as the reply."""
    texts = [f"How long has this been going on for you, {who}?" for who in ("then", "friend", "now", "really")]
    recs = [{"id": f"{r['dialogue_id']}#r{r['round_index']}", "status": "ok", "history": r["history"],
             "reference": r["reference"], "gold_strategy": r["strategy"], "format_ok": True, "text": t,
             "raw": _raw(s, t)} for r, s, t in zip(rounds, strategies, texts)]
    write_jsonl(root / "eval" / "c" / "records.jsonl", recs)
    return root


def _off_stage(strategy: str) -> str:
    stage = load_config().strategy_stage
    return next(n for n in load_taxonomy().names if n in stage and stage[n] != stage.get(strategy, stage[n]))


def test_misfits_are_paired_against_the_real_reply_and_measured(tmp_path: Path,
                                                                corpus: tuple[list[dict], list[dict]]) -> None:
    rounds, dialogues = corpus
    staged = [r for r in rounds if r["lang"] == "en" and r["strategy"] in load_config().strategy_stage][:4]
    loop = _misfit_folder(tmp_path / "loop", staged, [_off_stage(r["strategy"]) for r in staged])
    ing = tmp_path / "i" / "dialogues.jsonl"
    assert main(["policy-negatives", "--quiet", "--stage-misfit", "--kinds", "misfit", "--from", str(loop),
                 "--dialogues", f"train={ing}", "--out", str(tmp_path / "pn")]) == 0
    recs = list(read_jsonl(tmp_path / "pn" / "policy_negatives.jsonl"))
    assert [r["kind"] for r in recs] == ["misfit"] * 4 and not any(r["conversation_free"] for r in recs)
    assert [r["gold_strategy"] for r in recs] == [r["strategy"] for r in staged]
    # an xz-compressed file (as committed) reads the same
    packed = tmp_path / "pn.jsonl.xz"
    packed.write_bytes(lzma.compress((tmp_path / "pn" / "policy_negatives.jsonl").read_bytes()))
    pool = PolicyPool.load([packed])
    assert pool.records == recs
    tax, cfg = load_taxonomy(), load_config()
    plain, _ = build_silver(rounds, tax, cfg, seed=1, dialogues=dialogues, pool="train")
    items, counts = build_silver(rounds, tax, cfg, seed=1, dialogues=dialogues, pool="train", policy=pool)
    assert len(items) == len(plain)
    marked = {(r["dialogue_id"], r["round_index"]) for r in recs}
    for a, b in zip(plain, items):
        # the same preference pair as without the file (which step slots are corrupted is drawn over all rounds, so
        # it may move, and the reply items drawn after it with it)
        if (a["dialogue_id"], a["round_index"]) not in marked and a["item_id"].endswith("/silver"):
            assert (a["reference"], parse(a["candidate"]).response, a["negative"]) == (
                b["reference"], parse(b["candidate"]).response, b["negative"])
    used = [it for it in items if it["negative"] == POLICY_MISFIT]
    assert used and counts[f"negative_{POLICY_MISFIT}"] == len(used)
    for it in used:
        rec = next(r for r in recs if r["prompt_id"] == it["construction"]["negative"]["prompt_id"])
        if it["construction"]["pair"] == "gold_vs_hack":  # the misfit is the candidate: step 3 names its strategy
            assert it["labels"]["preference"] == "first" and it["labels"]["step3"] is False
            assert it["construction"]["corrupted"]["step3"] == "stage_mismatch"
            assert rec["strategy"] in parse(it["candidate"]).parts["strategy"]
            assert parse(it["candidate"]).response == rec["text"]
        else:
            assert it["construction"]["pair"] == "hack_vs_gold" and it["labels"]["preference"] == "second"
            assert it["reference"] == rec["text"]
    # contrast (the pool's own split only): the misfit's step 3 and reply differ from the positive, nothing else, and
    # the group's other candidates are those built without the file
    groups, gcounts = build_contrast(rounds, tax, cfg, seed=0, dialogues=dialogues, pool="train", policy=pool)
    bare, _ = build_contrast(rounds, tax, cfg, seed=0, dialogues=dialogues, pool="train")
    with_misfit = [g for g in groups if POLICY_MISFIT in g["candidates"]]
    assert len(with_misfit) == len(marked) and gcounts[f"built_{POLICY_MISFIT}"] == len(marked)
    for g, b in zip(groups, bare):
        assert {k: v for k, v in g["candidates"].items() if k != POLICY_MISFIT} == b["candidates"]
    for g in with_misfit:
        pos, neg = parse(g["candidates"]["positive"]), parse(g["candidates"][POLICY_MISFIT])
        assert {p for p in PARTS if neg.parts[p] != pos.parts[p]} == {"strategy", "response"}
        assert g["negatives"][POLICY_MISFIT]["strategy"] in neg.parts["strategy"]
    evalgroups, _ = build_contrast(rounds, tax, cfg, seed=0, dialogues=dialogues, pool="eval", policy=pool)
    assert not any(POLICY_MISFIT in g["candidates"] for g in evalgroups)  # train-prompt texts never measure


def test_committed_misfit_files_hold_their_split_only() -> None:
    """The committed misfit files (data_builder/data/README.md): round 5's from GRPO training prompts (judge training
    only), the loop's from valid prompts (the contrast kind only; never conversation-free, so never used detached)."""
    folder = Path(__file__).resolve().parents[2] / "data_builder" / "data"
    train = PolicyPool.load([folder / "policy_negatives_grpo_round5.jsonl.xz"])
    valid = PolicyPool.load([folder / "policy_negatives_loop_valid_misfit.jsonl.xz"])
    assert {r["split"] for r in train.records} == {"train"} and {r["split"] for r in valid.records} == {"valid"}
    assert set(valid.by_kind) == {"misfit"} and len(train.by_kind["misfit"]) == 7492
    stage = load_config().strategy_stage
    for r in train.by_kind["misfit"] + valid.records:
        assert not r["conversation_free"] and stage[r["strategy"]] != stage[r["gold_strategy"]]
