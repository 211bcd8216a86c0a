"""Negatives a policy really produces: rule-made hacks from split-disjoint pools, their labels in the judge items, the
policy-hack labeller on replies the COMPEER loop's policies wrote, and contrast groups with one differing part each."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import pytest
from datasets import load_from_disk

from cer.reasoning import PARTS, parse
from cer.taxonomy import load_taxonomy
from data_builder.cli import main
from data_builder.contrast import NEGATIVE_KINDS, POLICY_KINDS, build_contrast
from data_builder.negatives import HACK_KINDS, HackMaker, PolicyPool, normalise, seeker_echo
from data_builder.policy_negatives import Labeller, repeated_texts
from data_builder.records import read_jsonl, write_jsonl
from data_builder.silver import HACK_CANDIDATE, build_silver, support_stage
from data_builder.silver_text import REPLY_POOLS, load_config

STAGE_WORDS = ("exploration", "comforting", "action", "探索", "安慰", "行动")


def _from_pool(text: str, lang: str, kind: str, pool: str) -> bool:
    """Whether ``text`` is one of the pool's texts with its fields filled (stage, strategy, seeker's words)."""
    cfg, tax = load_config(), load_taxonomy()
    stages = [v for t in cfg.templates.values() for v in t["stages"].values()]
    fill = {"stage": "|".join(map(re.escape, stages)),
            "Stage": "|".join(re.escape(v[:1].upper() + v[1:]) for v in stages),
            "strategy": "|".join(map(re.escape, tax.names)), "echo": ".+", "echo_lc": ".+"}
    for t in cfg.hack_texts(lang, kind, pool):
        pattern = re.sub(r"\\\{(\w+)\\\}", lambda m: f"(?:{fill[m.group(1)]})", re.escape(t))
        if re.fullmatch(pattern, text, re.DOTALL):
            return True
    return False


def test_train_and_eval_pools_share_no_text() -> None:
    cfg = load_config()
    for lang, kinds in cfg.negative_replies.items():
        assert set(kinds) == set(HACK_KINDS)
        for kind in kinds:
            train, ev = ({normalise(t) for t in cfg.hack_texts(lang, kind, p)} for p in REPLY_POOLS)
            assert train and ev and not train & ev, (lang, kind, train & ev)


@pytest.mark.parametrize("pool", REPLY_POOLS)
def test_each_rule_made_kind_comes_from_its_pool(corpus: tuple[list[dict], list[dict]], pool: str) -> None:
    rounds, _ = corpus
    maker = HackMaker(load_config(), load_taxonomy(), pool)
    other = next(p for p in REPLY_POOLS if p != pool)
    rules: set[str] = set()
    for r in rounds:
        rng = random.Random(r["round_index"])
        for kind in HACK_KINDS:
            neg = maker.rule_made(kind, r, "comforting", rng)
            assert neg is not None and neg.kind == kind and neg.source == "rule" and neg.text.strip()
            rules.add(neg.rule)
            lang = r["lang"]
            if neg.rule == "truncated":  # the real reply cut off mid-sentence
                assert r["reference"].startswith(neg.text) and len(neg.text) < len(r["reference"])
                assert not neg.text.endswith((".", "!", "?", "。"))
                continue
            # (an echo's words are the seeker's: only its wrapper comes from the pool, and train's bare echo matches any)
            assert _from_pool(neg.text, lang, kind, pool) and (kind == "echo" or not _from_pool(neg.text, lang, kind, other))
            if kind == "echo":  # the seeker's last sentence, its first letter perhaps in lower case
                assert seeker_echo(r["history"], lang)[1:] in neg.text
    assert {"fragment", "truncated", "template", "wrapped"} <= rules


def test_silver_hacks_lose_and_carry_no_strategy(corpus: tuple[list[dict], list[dict]]) -> None:
    rounds, dialogues = corpus
    tax = load_taxonomy()
    for pool in REPLY_POOLS:
        items, counts = build_silver(rounds * 4, tax, load_config(), seed=7, dialogues=dialogues, pool=pool)
        other = next(p for p in REPLY_POOLS if p != pool)
        hacks = [it for it in items if it.get("negative") in HACK_KINDS]
        assert {it["negative"] for it in hacks} == set(HACK_KINDS)
        for it in hacks:
            meta = it["construction"]["negative"]
            assert meta["kind"] == it["negative"] and meta["source"] == "rule"
            text = parse(it["candidate"]).response if meta.get("role", "candidate") == "candidate" else it["reference"]
            if meta["rule"] != "truncated":
                assert _from_pool(text, it["lang"], it["negative"], pool)
                assert it["negative"] == "echo" or not _from_pool(text, it["lang"], it["negative"], other)
            if "reply" in it["labels"]:  # mode reply: a hack is a False reply
                assert it["labels"]["reply"] is False
                continue
            pair = it["construction"]["pair"]
            assert it["labels"]["preference"] == {"gold_vs_hack": "first", "hack_vs_gold": "second",
                                                  "off_vs_hack": "neither"}[pair]
            if pair in HACK_CANDIDATE:  # step 3 names the round's strategy beside a reply that carries out none
                assert it["labels"]["step3"] is False and it["rationales"]["step3"] == "the reply carries out no strategy."
        assert counts["step3_false_beside_a_hack"] == sum(it["construction"].get("pair") in HACK_CANDIDATE for it in items)


def test_stage_mismatch_names_a_strategy_of_another_stage(corpus: tuple[list[dict], list[dict]]) -> None:
    rounds, dialogues = corpus
    cfg, tax = load_config(), load_taxonomy()
    items, counts = build_silver(rounds * 6, tax, cfg, false_share=1.0, seed=1, dialogues=dialogues, reply_items=False)
    mismatched = [it for it in items if it["construction"]["corrupted"].get("step3") == "stage_mismatch"]
    assert mismatched and counts["corrupted_step3_stage_mismatch"] == len(mismatched)
    by_round = {(r["dialogue_id"], r["round_index"]): r for r in rounds}
    for it in mismatched:
        r = by_round[(it["dialogue_id"], it["round_index"])]
        stage = support_stage(r["strategy"], r["round_index"], r["num_rounds"], cfg)
        named = next(n for n in tax.names if n in parse(it["candidate"]).parts["strategy"])
        assert cfg.strategy_stage[named] != stage and not it["labels"]["step3"]
        assert it["rationales"]["step3"] == f"{named} does not fit the {stage} stage."


# Replies the COMPEER loop's policies wrote on valid prompts (docs/evaluations/compeer-loop/inputs, machine 1-2).
LOOP_REPLIES = [
    ("I would place this in the comforting stage.", "degenerate", "stage_label"),
    ("I understand that. I would place this in the comforting phase.", "degenerate", "stage_label"),
    ("I think it's a good time to be in the comforting phase.", "degenerate", "stage_label"),
    ("The seeker's main problem is job crisis: I am jobless and I am not sure if I should continue to work.",
     "degenerate", "judge_wording"),
    ("I'm so sorry to hear that. I'm so sorry to hear that. I'm so sorry to hear that.", "degenerate", "repetition"),
    ("I understand.", "generic", "template"),
    ("I hope you are well.", "generic", "short_no_content"),
    ("I understand. What brings you here?", "generic", "repeated_across_prompts"),
    ("I would suggest you try to talk to your supervisor about it. Sometimes it's not that bad to talk to them about it.",
     None, None),
    ("I understand how scary it is. Do you think you will be able to get a job again?", None, None),
]


def test_labeller_on_replies_the_loop_policies_wrote() -> None:
    history = [{"role": "seeker", "text": "My co worker keeps going behind my back and I lost my job."},
               {"role": "supporter", "text": "That sounds like a difficult situation."},
               {"role": "seeker", "text": "I have been having such a hard time falling asleep at night."}]
    written = [(f"p{i}", "I understand. What brings you here?") for i in range(3)] + [("p9", LOOP_REPLIES[0][0])]
    labeller = Labeller(load_config(), load_taxonomy(), repeated_texts(written, 3))
    for text, kind, rule in LOOP_REPLIES:
        got = labeller.label(text, history)
        assert got == ((kind, rule) if kind else None), text
    assert labeller.label("I have been having such a hard time falling asleep at night.", history) == ("echo", "echo")
    assert labeller.label("Just get over it.", history) == ("dismissive", "dismissive")
    assert labeller.label("...", history) == ("degenerate", "empty")
    cut = "I think you should try to read a book, but I think you should try to read a different one and see how it"
    assert labeller.label(cut, history, raw=cut, format_ok=False) == ("degenerate", "truncated")
    assert labeller.label(cut, history, raw=f"<response>{cut}.</response>", format_ok=True) is None
    # a completion cut at the token limit inside its analysis: read from the tag-stripped text, it names a stage and
    # opens with the judge's wording, yet what is wrong with it is the cut
    raw = ("<analysis>The seeker's main problem is job crisis: they lost their job after a co-worker went behind "
           "their back; the conversation is at the comforting stage and the")
    stripped = " ".join(raw.replace("<analysis>", " ").split())
    assert labeller.label(stripped, history, raw=raw, format_ok=False) == ("degenerate", "truncated")
    assert labeller.label(stripped + ".", history, raw=raw + ".", format_ok=False)[1] in ("stage_label", "judge_wording")


def _loop_folder(root: Path, rounds: list[dict], texts: dict[str, list[str]]) -> Path:
    """A compeer-loop folder with one evaluation's records per policy (the evaluator's schema)."""
    for policy, replies in texts.items():
        recs = [{"id": f"{r['dialogue_id']}#r{r['round_index']}", "status": "ok", "history": r["history"],
                 "reference": r["reference"], "text": t, "raw": f"<response>{t}</response>", "format_ok": True}
                for r, t in zip(rounds, replies)]
        write_jsonl(root / "eval" / policy / "records.jsonl", recs)
    return root


def test_policy_negatives_stage_and_its_use(tmp_path: Path, corpus: tuple[list[dict], list[dict]]) -> None:
    rounds, dialogues = corpus
    en = [r for r in rounds if r["lang"] == "en"][:6]
    echo = en[1]["history"][-1]["text"]
    loop = _loop_folder(tmp_path / "machine9", en, {
        "c": ["I would place this in the comforting stage.", echo, "I understand. What brings you here?",
              "I understand. What brings you here?", "I understand. What brings you here?",
              "Maybe you could ask your manager for a reference before the contract ends?"]})
    ing = tmp_path / "i" / "dialogues.jsonl"
    assert main(["policy-negatives", "--quiet", "--from", str(loop), "--dialogues", f"valid={ing}",
                 "--out", str(tmp_path / "pn")]) == 0
    recs = list(read_jsonl(tmp_path / "pn" / "policy_negatives.jsonl"))
    assert [(r["kind"], r["rule"]) for r in recs] == [("degenerate", "stage_label"), ("echo", "echo")] + [
        ("generic", "repeated_across_prompts")] * 3
    assert all(r["split"] == "valid" and r["run"] == "machine9" and r["policy"] == "c" and "history" not in r
               for r in recs)
    assert not recs[1]["conversation_free"]  # an echo belongs to its conversation
    manifest = json.loads((tmp_path / "pn" / "manifest.json").read_text())
    assert manifest["counts"]["not_marked_valid"] == 1 and manifest["counts"]["negatives"] == 5
    pool = PolicyPool.load([tmp_path / "pn" / "policy_negatives.jsonl"])
    # contrast (valid): the policy's own reply on this prompt when there is one, else a conversation-free one
    groups, counts = build_contrast(en, load_taxonomy(), load_config(), seed=0, dialogues=dialogues, policy=pool)
    assert counts["built_policy_echo"] == 1 and counts["policy_echo_on_its_own_prompt"] == 1
    for g in groups:
        pos = parse(g["candidates"]["positive"])
        for kind in set(g["candidates"]) & set(POLICY_KINDS):
            neg = parse(g["candidates"][kind])
            assert {p for p in PARTS if neg.parts[p] != pos.parts[p]} == {"response"}
            meta = g["negatives"][kind]
            assert meta["source"] == "policy" and meta["split"] == "valid" and meta["policy"] == "c"
            if meta["same_prompt"]:
                assert meta["prompt_id"] == f"{g['dialogue_id']}#r{g['round_index']}"
    # silver for training: valid-prompt texts only detached and conversation-free, never an echo
    cfg = load_config()
    items, _ = build_silver(rounds * 3, load_taxonomy(), cfg, seed=2, dialogues=dialogues, pool="train", policy=pool)
    used = [it for it in items if str(it.get("negative")).startswith("policy_")]
    assert used and {it["negative"] for it in used} <= {"policy_degenerate", "policy_generic"}
    free = {r["text"] for r in recs if r["conversation_free"]}
    assert all(it["construction"]["negative"]["prompt_id"] for it in used)
    assert all((parse(it["candidate"]).response in free) or (it["reference"] in free) for it in used)


def test_policy_negatives_from_a_grpo_completions_file(tmp_path: Path, corpus: tuple[list[dict], list[dict]]) -> None:
    """What ``log_completions_file`` writes (by the real reward function, on real rounds) is read back with each
    completion's conversation rebuilt from its dialogue and round: the echo rule sees the seeker's words."""
    import asyncio

    from policy_trainer.rewards import CompeerReward, RewardSettings
    from tests.unit.test_policy_fakes import FakeRewardClient

    rounds, _ = corpus
    en = [r for r in rounds if r["lang"] == "en" and r["round_index"] > 1][:2]
    echo = en[1]["history"][-1]["text"]
    texts = ["<response>I would place this in the comforting stage.</response>",
             ("<analysis>fine</analysis><emotion>sadness</emotion><strategy>Question</strategy>"
              "<response>What happened after that?</response>"), f"<response>{echo}</response>", "Okay."]
    out = tmp_path / "grpo-run"
    reward = CompeerReward(RewardSettings(num_generations=2, completions_path=out / "completions.jsonl"),
                           lambda: FakeRewardClient({}))
    asyncio.run(reward(prompts=[[]] * 4, completions=[[{"role": "assistant", "content": t}] for t in texts],
                       completion_ids=[[0]] * 4, history=[en[0]["history"]] * 2 + [en[1]["history"]] * 2,
                       reference=["r"] * 4, dialogue_id=[en[0]["dialogue_id"]] * 2 + [en[1]["dialogue_id"]] * 2,
                       log_metric=None))
    with (out / "completions.jsonl").open("a") as fh:  # a line of an older run: no round, skipped and counted
        fh.write(json.dumps({"dialogue_id": en[0]["dialogue_id"], "text": "Okay."}) + "\n")
    ing = tmp_path / "i" / "dialogues.jsonl"
    assert main(["policy-negatives", "--quiet", "--from", str(out), "--dialogues", f"train={ing}",
                 "--out", str(tmp_path / "pn")]) == 0
    recs = list(read_jsonl(tmp_path / "pn" / "policy_negatives.jsonl"))
    assert [(r["policy"], r["run"], r["split"]) for r in recs] == [("grpo", "grpo-run", "train")] * 3
    assert [r["prompt_id"] for r in recs] == [f"{en[0]['dialogue_id']}#r{en[0]['round_index']}"] + [
        f"{en[1]['dialogue_id']}#r{en[1]['round_index']}"] * 2
    assert [(r["kind"], r["rule"]) for r in recs][:2] == [("degenerate", "stage_label"), ("echo", "echo")]
    assert recs[0]["text"] == "I would place this in the comforting stage." and not recs[0]["format_ok"]
    assert recs[2]["kind"] == "generic" and recs[2]["text"] == "Okay."
    counts = json.loads((tmp_path / "pn" / "manifest.json").read_text())["counts"]
    assert counts["skipped_completion_without_round"] == 1 and counts["not_marked_train"] == 1


def test_round_index_of_a_history_is_the_round_it_ends_before(corpus: tuple[list[dict], list[dict]]) -> None:
    from data_builder.policy_negatives import history_before, round_index_of

    rounds, dialogues = corpus
    turns = {d["id"]: d["turns"] for d in dialogues}
    for r in rounds:
        assert round_index_of(r["history"]) == r["round_index"]
        assert history_before(turns[r["dialogue_id"]], r["round_index"]) == r["history"]
    assert history_before(turns[rounds[0]["dialogue_id"]], 10_000) is None


def test_contrast_groups_differ_in_one_part_per_kind(corpus: tuple[list[dict], list[dict]]) -> None:
    rounds, dialogues = corpus
    groups, counts = build_contrast(rounds, load_taxonomy(), load_config(), seed=0, dialogues=dialogues)
    reply_kinds = {"other_round", "other_dialogue", *HACK_KINDS}
    for g in groups:
        pos = parse(g["candidates"]["positive"])
        for kind in set(g["candidates"]) - {"positive"}:
            assert kind in NEGATIVE_KINDS
            neg = parse(g["candidates"][kind])
            assert neg.ok
            differ = {p for p in PARTS if neg.parts[p] != pos.parts[p]}
            assert len(differ) == 1 and (differ == {"response"}) == (kind in reply_kinds), (kind, differ)
        for kind in HACK_KINDS:
            assert g["negatives"][kind]["source"] == "rule" and kind in g["candidates"]
            text = parse(g["candidates"][kind]).response
            if g["negatives"][kind]["rule"] != "truncated":
                assert _from_pool(text, g["lang"], kind, "eval")
                assert kind == "echo" or not _from_pool(text, g["lang"], kind, "train")
    assert all(counts[f"missing_{k}"] == len(groups) for k in POLICY_KINDS)  # no policy file given


def test_emit_keeps_the_negative_kind_and_counts_labels(tmp_path: Path, corpus: tuple[list[dict], list[dict]]) -> None:
    rounds, dialogues = corpus
    items, _ = build_silver(rounds, load_taxonomy(), load_config(), seed=4, dialogues=dialogues)
    write_jsonl(tmp_path / "items.jsonl", items)
    assert main(["emit", "--quiet", "--heldout-fraction", "0.4", "--modes", "unified", "reply", "--out",
                 str(tmp_path / "emit"), str(tmp_path / "items.jsonl")]) == 0
    dd = load_from_disk(str(tmp_path / "emit" / "judge_sft" / "reply"))
    got = sorted(n or "none" for s in dd for n in dd[s]["negative"])
    assert got == sorted(it["negative"] or "none" for it in items if "reply" in it["labels"])
    counts = json.loads((tmp_path / "emit" / "manifest.json").read_text())["counts"]
    reply_labels = counts["labels_reply"]
    assert sum(reply_labels[s]["reply"].get("True", 0) for s in reply_labels) == len(rounds)
    assert set(counts["labels_unified"]["train"]) == {"step1", "step2", "step3", "preference"}


def test_judge_contrast_reports_every_kind_of_the_groups(corpus: tuple[list[dict], list[dict]]) -> None:
    """reward_trainer's judge-contrast takes the kinds from the groups (no fixed list): every new kind is reported."""
    from reward_trainer.contrast import render_markdown, summarise

    rounds, dialogues = corpus
    groups, _ = build_contrast(rounds, load_taxonomy(), load_config(), seed=0, dialogues=dialogues)
    totals = [{k: float(i % 3) for i, k in enumerate(g["candidates"])} for g in groups]
    s = summarise(totals)
    kinds = set().union(*(g["candidates"] for g in groups)) - {"positive"}
    assert set(s["kinds"]) == kinds >= {"stage_mismatch", *HACK_KINDS}
    table = render_markdown({"judges": {"t": {"gold": {"discrete": s, "graded": s}}}})
    assert all(f"| {k} |" in table for k in kinds)


def test_committed_policy_negatives_load_and_grpo_rounds_hold_train_prompts_only() -> None:
    """The packaged policy-made negatives (data_builder/data/README.md) load as records of known kinds and rules; the
    GRPO rounds' files came from training prompts, so a valid dialogue in them would leak into judge training."""
    folder = Path(__file__).resolve().parents[2] / "data_builder" / "data"
    files = sorted([*folder.glob("policy_negatives*.jsonl"), *folder.glob("policy_negatives*.jsonl.xz")])
    assert {f.name for f in files} >= {"policy_negatives.jsonl", "policy_negatives_grpo_round2.jsonl",
                                      "policy_negatives_grpo_round3.jsonl", "policy_negatives_grpo_round4.jsonl",
                                      "policy_negatives_grpo_round5.jsonl.xz"}
    for f in files:
        pool = PolicyPool.load([f])
        assert pool.records and set(pool.by_kind) <= {"degenerate", "generic", "echo", "dismissive", "misfit"}, f.name
        assert all(r["text"].strip() and r["rule"] for r in pool.records), f.name
        if "grpo" in f.name:
            assert {r["split"] for r in pool.records} == {"train"}, f.name
    assert len(PolicyPool.load([folder / "policy_negatives_grpo_round3.jsonl"]).records) == 1525
    assert len(PolicyPool.load([folder / "policy_negatives_grpo_round4.jsonl"]).records) == 226
