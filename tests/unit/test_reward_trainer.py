"""reward_trainer unit tests: judge-turn label masking, Table 1 metrics on hand-made predictions, config checks,
the inconsistency rule and audit, the prediction path through the serving Judge, the report, the CLI parser."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cer.verdicts import Preference
from judge.engines.base import GenParams, Message
from judge.protocol import JudgeSettings
from tests.fake_engine import FakeEngine
from tests.unit.test_reward_trainer_fixtures import judge_item, rows_for, write_judge_sft

P = Preference


# --------------------------------------------------------------------------- label masking (Eq. 4)
@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    from judge.model_store import resolve_model

    return AutoTokenizer.from_pretrained(resolve_model("default").path, local_files_only=True)


@pytest.mark.parametrize("mode", ["unified", "prm", "orm"])
def test_labels_keep_exactly_the_judge_turns(tokenizer, mode: str) -> None:
    from cer.modes import JudgeMode
    from reward_trainer.data import IGNORE_INDEX, judge_turn_labels

    messages = rows_for(JudgeMode(mode), [judge_item(3)])[0]["messages"]
    enc = judge_turn_labels(tokenizer, messages)
    ids, labels = enc["input_ids"], enc["labels"]
    assert len(ids) == len(labels)
    # every kept label equals its input id; the kept tokens decode to the judge turns, each ended by <|im_end|>
    kept = [t for t, lab in zip(ids, labels) if lab != IGNORE_INDEX]
    assert all(lab in (IGNORE_INDEX, t) for t, lab in zip(ids, labels))
    expected = "".join(m["content"] + tokenizer.eos_token for m in messages if m["role"] == "assistant")
    assert tokenizer.decode(kept) == expected
    # the whole conversation is in input_ids (prompts are context, not dropped)
    assert tokenizer.decode(ids) == tokenizer.apply_chat_template(messages, tokenize=False)
    # kept spans are contiguous runs, one per judge turn
    runs = sum(1 for i, lab in enumerate(labels) if lab != IGNORE_INDEX and (i == 0 or labels[i - 1] == IGNORE_INDEX))
    assert runs == sum(1 for m in messages if m["role"] == "assistant")


def test_labels_mask_system_and_user_text(tokenizer) -> None:
    from cer.modes import JudgeMode
    from reward_trainer.data import IGNORE_INDEX, judge_turn_labels

    messages = rows_for(JudgeMode.UNIFIED, [judge_item(0)])[0]["messages"]
    enc = judge_turn_labels(tokenizer, messages)
    kept_text = tokenizer.decode([t for t, lab in zip(enc["input_ids"], enc["labels"]) if lab != IGNORE_INDEX])
    assert "UnifiReward" not in kept_text and "Conversation so far" not in kept_text
    assert "<|im_start|>" not in kept_text and "assistant\n" not in kept_text


def test_oversample_false_repeats_only_rows_with_a_false_step() -> None:
    from datasets import Dataset

    from reward_trainer.data import has_false_step, oversample_false

    ds = Dataset.from_list([{"labels": {"step1": True, "step2": True, "step3": True, "preference": "first"}},
                            {"labels": {"step1": True, "step2": False, "step3": True, "preference": "first"}}])
    out = oversample_false(ds, 3.0, seed=0)
    flags = [has_false_step(x) for x in out["labels"]]
    assert len(out) == 4 and flags.count(True) == 3 and flags.count(False) == 1
    assert len(oversample_false(ds, 1.0, seed=0)) == 2


def test_load_judge_set_rejects_wrong_mode_and_missing_folder(tmp_path: Path) -> None:
    from reward_trainer.data import load_judge_set

    write_judge_sft(tmp_path, 2, 1, modes=("prm",))
    with pytest.raises(FileNotFoundError, match="compeer-data emit"):
        load_judge_set(tmp_path, "unified")
    with pytest.raises(ValueError, match="holds mode"):
        load_judge_set(tmp_path / "prm", "orm")


# --------------------------------------------------------------------------- metrics
def test_step_scores_by_hand() -> None:
    from reward_trainer.metrics import step_scores

    wf1, false_recall = step_scores([True, True, False, False], [True, False, False, None])
    # True: P=1 R=1/2 F1=2/3; False: P=1/2 R=1/2 F1=1/2; weighted by support 2/2 → 7/12; the None counts as wrong
    assert wf1 == pytest.approx(7 / 12)
    assert false_recall == pytest.approx(0.5)


def test_response_scores_by_hand() -> None:
    from reward_trainer.metrics import response_scores

    wf1, acc = response_scores([P.FIRST, P.SECOND, P.SECOND, P.NEITHER], [P.FIRST, P.SECOND, P.BOTH_GOOD, None])
    # first F1=1 (support 1), second P=1 R=1/2 F1=2/3 (support 2), neither F1=0 (support 1) → (1 + 4/3 + 0) / 4
    assert wf1 == pytest.approx(7 / 12)
    assert acc == pytest.approx(0.5)


def test_score_counts_parse_failures_and_confusion() -> None:
    from reward_trainer.metrics import INVALID, score

    gold = [{"step1": True, "step2": False, "step3": True, "preference": P.FIRST},
            {"step1": False, "step2": False, "step3": True, "preference": P.SECOND}]
    pred = [{"step1": True, "step2": None, "step3": True, "preference": P.FIRST},
            {"step1": False, "step2": False, "step3": False, "preference": None}]
    m = score(gold, pred, ("step1", "step2", "step3", "preference"))
    assert m.parse_failure_rate == pytest.approx(2 / 8)
    assert m.step_false_recall[0] == 1.0 and m.step_false_recall[1] == 0.5
    assert m.step_false_recall[2] is not None and m.step_false_recall[2] != m.step_false_recall[2]  # no gold False
    assert m.response_accuracy == 0.5
    assert m.confusion["step2"] == [[0, 0, 0], [0, 1, 1]]  # rows True/False, cols True/False/invalid
    j = m.to_json()
    assert j["step_false_recall"][2] is None and INVALID  # NaN is written as null


def test_score_of_a_prm_variant_leaves_the_reply_columns_empty() -> None:
    from reward_trainer.metrics import METRIC_KEYS, score

    gold = [{"step1": True, "step2": True, "step3": False, "preference": P.FIRST}]
    m = score(gold, [{"step1": True, "step2": True, "step3": False}], ("step1", "step2", "step3")).to_json()
    assert set(METRIC_KEYS) <= set(m)
    assert m["response_accuracy"] is None and m["step_weighted_f1"] == [1.0, 1.0, 1.0]


def test_kappa_is_zero_for_a_constant_judge_and_matches_sklearn_with_unparsed_answers() -> None:
    from sklearn.metrics import cohen_kappa_score

    from reward_trainer.metrics import kappa
    from reward_trainer.report import kappa_row

    assert kappa([[40, 0, 0], [10, 0, 0]]) == 0.0  # always "True": the majority baseline
    assert kappa([[40, 0, 0], [0, 10, 0]]) == 1.0
    assert kappa([[0, 0, 0], [0, 0, 0]]) is None
    matrix = [[30, 5, 2], [7, 11, 1]]  # rows gold True/False; columns True/False/invalid
    gold = [i for i, row in enumerate(matrix) for j, n in enumerate(row) for _ in range(n)]
    pred = [j for i, row in enumerate(matrix) for j, n in enumerate(row) for _ in range(n)]
    assert kappa(matrix) == pytest.approx(cohen_kappa_score(gold, pred))
    row = kappa_row("unified", "trained", {"confusion": {"step1": matrix}})
    assert row == f"| unified | trained | {kappa(matrix):.3f} | n/a | n/a | n/a | n/a |"


def test_majority_labels_take_the_most_frequent_gold_label() -> None:
    from reward_trainer.metrics import majority_labels

    gold = [{"step1": True, "preference": P.SECOND}, {"step1": True, "preference": P.FIRST},
            {"step1": False, "preference": P.SECOND}]
    assert majority_labels(gold, ("step1", "preference")) == {"step1": True, "preference": P.SECOND}


# --------------------------------------------------------------------------- config
def _cfg(**kw):
    from reward_trainer.config import config_from_mapping

    base = {"output_dir": "/tmp/rt-cfg", "bf16": False, "use_cpu": True}
    return config_from_mapping({**base, **kw})


@pytest.mark.parametrize(("kw", "remedy"), [
    ({"variant": "both"}, "set `variant:`"),
    ({"lora_r": 0}, "LoRA rank must be >= 1"),
    ({"lora_dropout": 1.0}, "must be in [0, 1)"),
    ({"false_oversample": 0.5}, "1.0 turns it off"),
    ({"assistant_only_loss": True}, "builds the labels itself"),
    ({"packing": True}, "set `packing: false`"),
    ({"max_length": 64}, "use >= 1024"),
    ({"data_dir": " "}, "compeer-data emit"),
])
def test_config_checks_state_the_remedy(kw: dict, remedy: str) -> None:
    with pytest.raises(ValueError) as err:
        _cfg(**kw)
    assert remedy in str(err.value)


def test_config_rejects_unknown_keys_with_a_suggestion() -> None:
    with pytest.raises(ValueError, match="did you mean 'lora_alpha'"):
        _cfg(lora_alfa=8)


def test_bf16_without_gpu_is_refused_with_the_remedy(monkeypatch: pytest.MonkeyPatch) -> None:
    from reward_trainer import config

    monkeypatch.setattr(config, "_cuda_available", lambda: False)
    with pytest.raises(ValueError, match="set `bf16: false`"):
        _cfg(bf16=True)
    with pytest.raises(ValueError, match="bf16: false"):
        config.load_config("gpu", {"output_dir": "/tmp/rt-gpu"})
    assert config.load_config("gpu", {"bf16": False, "output_dir": "/tmp/rt-gpu"}).variant == "unified"


def test_profiles_load_and_cpu_smoke_is_cpu_safe() -> None:
    from reward_trainer.config import JudgeSFTConfig, load_config, profile_names

    assert {"cpu-smoke", "gpu"} <= set(profile_names())
    cfg = load_config("cpu-smoke", {"max_steps": 1, "output_dir": "/tmp/rt-smoke"})
    assert isinstance(cfg, JudgeSFTConfig)
    assert cfg.max_steps == 1 and not cfg.bf16 and not cfg.gradient_checkpointing and cfg.variant == "unified"
    with pytest.raises(ValueError, match="no shipped profile"):
        load_config("no-such-profile")
    qwen = load_config("gpu-qwen15-esconv", {"bf16": False, "output_dir": "/tmp/rt-qwen"})
    assert qwen.model == "qwen2.5-coder-1.5b" and qwen.lora_r == 8 and "down_proj" in qwen.lora_target_modules


# --------------------------------------------------------------------------- inconsistency
def test_rule_contradicts() -> None:
    from reward_trainer.inconsistency import rule_contradicts

    assert rule_contradicts([True, True, True], P.NEITHER)
    assert rule_contradicts([False, False, True], P.SECOND)
    assert rule_contradicts([False, False, False], P.BOTH_GOOD)
    assert not rule_contradicts([True, True, True], P.SECOND)
    assert not rule_contradicts([True, True, True], P.FIRST)
    assert not rule_contradicts([False, True, True], P.NEITHER)
    assert not rule_contradicts([False, False, False], P.FIRST)


def _pred(key: str, steps: list[bool | None], pref: P | None, texts: list[str]):
    from reward_trainer.predict import Prediction

    v: dict = {f"step{i + 1}": s for i, s in enumerate(steps)}
    if pref is not None or not steps:
        v["preference"] = pref
    return Prediction(key, v, texts)


async def test_audit_uses_the_auditor_answers_and_reports_both_ratios() -> None:
    from reward_trainer.inconsistency import audit, common_keys, from_prm_orm, from_unified

    unified = [_pred("a", [True, True, True], P.NEITHER, ["r1"]), _pred("b", [True, True, True], P.SECOND, ["r2"]),
               _pred("c", [True, None, True], P.SECOND, ["r3"])]  # c: incomplete → not auditable
    prm = [_pred("a", [True, True, True], None, ["p"]), _pred("b", [False, False, True], None, ["p"])]
    orm = [_pred("a", [], P.SECOND, ["o"]), _pred("b", [], P.SECOND, ["o"]), _pred("c", [], P.FIRST, ["o"])]
    prm = [type(p)(p.key, {k: v for k, v in p.verdicts.items() if k != "preference"}, p.texts) for p in prm]
    uni, sep = common_keys(from_unified(unified), from_prm_orm(prm, orm))
    assert [a.key for a in uni] == ["a", "b"] and [a.key for a in sep] == ["a", "b"]

    def responder(messages: list[Message], params: GenParams) -> str:
        user = messages[-1]["content"]
        assert "Rule:" in user and messages[0]["role"] == "system"
        if "step 1 = False" in user:
            return "Rationale: mostly wrong steps but a better reply.\nVerdict: True"
        if "preference = neither" in user:
            return "Rationale: sound steps, no acceptable reply.\nVerdict: True"
        return "no verdict here"  # unparsable: retried, then excluded from the ratio

    engine = FakeEngine(responder)
    await engine.start()
    settings = JudgeSettings(max_retries=1, seed=0)
    res_u = await audit(engine, "unified", uni, settings)
    res_s = await audit(engine, "prm+orm", sep, settings)
    assert (res_u.n_items, res_u.n_audited, res_u.n_unparsed, res_u.ratio) == (2, 1, 1, 1.0)
    assert res_u.rule_ratio == 0.5 and res_u.agreement == 1.0
    assert (res_s.n_audited, res_s.ratio, res_s.rule_ratio) == (1, 1.0, 0.5)
    assert len(engine.calls) == 2 * 1 + 2 * 2  # one answered at once, one retried, per setup


# --------------------------------------------------------------------------- prediction through the serving Judge
async def test_predict_goes_through_the_serving_judge() -> None:
    from reward_trainer.metrics import score
    from reward_trainer.predict import JudgeRuntime, components_of, items_from_rows, make_judge, predict

    items = items_from_rows([judge_item(i) for i in range(3)])
    answers = iter(["Rationale: ok.\nVerdict: True", "Rationale: no.\nVerdict: False", "garbled",
                    "Rationale: r.\nVerdict: first"] * 3)
    engine = FakeEngine(lambda m, p: next(answers))
    await engine.start()
    runtime = JudgeRuntime(settings=JudgeSettings(max_retries=0, seed=0), concurrency=1)
    preds = await predict(make_judge(engine, runtime), items, "unified", concurrency=1)
    assert [p.verdicts["step1"] for p in preds] == [True, True, True]
    assert all(p.verdicts["step3"] is None and p.verdicts["preference"] is P.FIRST for p in preds)
    # the judge saw the template's system prompt and one user turn per round, as the service sends them
    assert engine.calls[0].messages[0]["role"] == "system" and len(engine.calls) == 12
    m = score([it.gold for it in items], [p.verdicts for p in preds], components_of("unified"))
    assert m.parse_failure_rate == pytest.approx(3 / 12)
    assert components_of("prm") == ("step1", "step2", "step3") and components_of("orm") == ("preference",)


# --------------------------------------------------------------------------- report and CLI
def test_report_has_every_table1_column(tmp_path: Path) -> None:
    from reward_trainer.metrics import score
    from reward_trainer.report import COLUMNS, plot_confusions, render_report

    gold = [{"step1": True, "step2": False, "step3": True, "preference": P.FIRST}]
    m = score(gold, [{"step1": True, "step2": True, "step3": None, "preference": P.FIRST}],
              ("step1", "step2", "step3", "preference"))
    png = plot_confusions(m, "unified / trained", tmp_path / "c.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    entry = {**m.to_json(), "judge": "trained", "baselines": {"majority": {**m.to_json(), "judge": "majority"}}}
    text = render_report({"unified": entry}, {"unified / trained": "c.png"})
    for col in COLUMNS:
        assert col in text
    assert "| unified | trained | 1 |" in text and "| unified | majority | 1 |" in text


def test_the_evaluation_counts_whether_a_judge_follows_the_question_cue() -> None:
    """cue_tables: per cell of the candidate's reply, the labels' and the judge's positive shares and the discordant
    items, for the preference (reply 2 preferred) and the reply mode (True); the report shows them."""
    from reward_trainer.evaluate import cue_tables
    from reward_trainer.predict import EvalItem, Prediction
    from reward_trainer.report import cue_section

    def item(key: str, reply: str, gold: dict) -> EvalItem:
        return EvalItem(key, [], "ref", f"<analysis>a</analysis><response>{reply}</response>", gold)

    items = [item("a", "How are you?", {"preference": P.FIRST}), item("b", "Any questions?", {"preference": P.SECOND}),
             item("c", "Okay.", {"preference": P.FIRST}), item("d", "I hear you.", {"preference": P.SECOND}),
             item("e", "What happened?", {"reply": False})]
    # the judge prefers both short questions and neither short statement, and calls the reply True
    preds = [Prediction("a", {"preference": P.SECOND}), Prediction("b", {"preference": P.SECOND}),
             Prediction("c", {"preference": P.FIRST}), Prediction("d", {"preference": None}),
             Prediction("e", {"reply": True})]
    t = cue_tables(items, preds)
    q, s = t["preference"]["cells"]["question, short"], t["preference"]["cells"]["no question, short"]
    assert (q["items"], q["label_pct"], q["judge_pct"], q["over"], q["under"]) == (2, 50.0, 100.0, 1, 0)
    assert (s["items"], s["label_pct"], s["judge_pct"], s["over"], s["under"]) == (2, 50.0, 0.0, 0, 1)
    assert t["preference"]["gap_question_minus_not"]["short"] == {"label_pct": 0.0, "judge_pct": 100.0}
    r = t["reply"]["cells"]["question, short"]
    assert (r["items"], r["label_pct"], r["judge_pct"], r["over"]) == (1, 0.0, 100.0, 1)
    text = "\n".join(cue_section({"unified": {"cues": {"trained": t}}, "meta": {}}))
    assert "## Surface cue" in text and "| unified | trained | preference | 2: 50.0 / 100.0 (1 / 0) |" in text
    assert cue_section({"unified": {"cues": {}}}) == []


def test_cli_parser_and_adapter_resolution(tmp_path: Path) -> None:
    from reward_trainer.cli import main, make_parser, parse_adapters

    args = make_parser().parse_args(["judge", "--config", "cpu-smoke", "--out", "x", "--max-steps", "3"])
    assert (args.command, args.config, args.out, args.max_steps) == ("judge", "cpu-smoke", "x", 3)
    args = make_parser().parse_args(["judge-eval", "--adapter", "a", "--data", "d", "--out", "o",
                                     "--backend", "vllm"])
    assert args.adapter == ["a"] and args.backend == "vllm"
    (tmp_path / "adapter_config.json").write_text("{}")
    with pytest.raises(ValueError, match="VARIANT=DIR"):
        parse_adapters([str(tmp_path)])
    (tmp_path / "compeer_judge.json").write_text(json.dumps({"variant": "prm"}))
    assert parse_adapters([str(tmp_path)]) == {"prm": str(tmp_path)}
    assert parse_adapters([f"orm={tmp_path}"]) == {"orm": str(tmp_path)}
    with pytest.raises(ValueError, match="not a PEFT adapter folder"):
        parse_adapters([str(tmp_path / "missing")])
    assert main(["judge", "--config", "no-such-profile"]) == 2
    assert main(["judge", "--help-config"]) == 0


def test_judging_commands_take_the_servers_rationale_bound() -> None:
    """judge-eval's --rationale-bound reaches the judge's engine config; the auditor's other backend keeps its own."""
    from reward_trainer.cli import eval_options, make_parser
    from reward_trainer.predict import engine_of, model_ref

    args = make_parser().parse_args(["judge-eval", "--adapter", "a", "--data", "d", "--out", "o", "--backend", "vllm",
                                     "--rationale-bound", "max_tokens"])
    options = eval_options(args, "d", "o")
    runtime = options.runtime
    assert runtime.rationale_bound == "max_tokens"
    assert options.save_texts is False  # the judge's outputs stay out of predictions.jsonl unless asked for
    assert engine_of(runtime, None).bound == "max_tokens"
    assert model_ref(runtime).bound == "max_tokens"  # what metrics.json's meta records
    assert engine_of(runtime, None, backend="transformers").bound == "line"  # auto there
    args = make_parser().parse_args(["judge-eval", "--adapter", "a", "--data", "d", "--out", "o",
                                     "--backend", "transformers", "--rationale-bound", "max_tokens"])
    assert eval_options(make_parser().parse_args(["judge-eval", "--adapter", "a", "--data", "d", "--out", "o",
                                                  "--save-texts"]), "d", "o").save_texts is True
    with pytest.raises(SystemExit):  # judge-eval's own flag: judge-contrast does not take it silently
        make_parser().parse_args(["judge-contrast", "--groups", "g", "--out", "o", "--save-texts"])
    with pytest.raises(ValueError, match="rationale_bound 'max_tokens': the transformers engine takes auto, line"):
        eval_options(args, "d", "o")


def test_ablation_pools_split_by_source(tmp_path: Path) -> None:
    from reward_trainer.ablation import read_pools

    items = [{"record": "judge_item", **judge_item(i)} for i in range(3)]
    items[1]["source"], items[2]["source"] = "rewrite", "persona"
    path = tmp_path / "items.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in items))
    extra = tmp_path / "persona.jsonl"  # a file of persona items: all of it joins the persona pool
    extra.write_text(json.dumps({"record": "judge_item", **judge_item(5)}) + "\n")
    base, rewrites, personas = read_pools([str(path)], [], [str(extra)])
    assert [len(base), len(rewrites), len(personas)] == [1, 1, 2]


def test_training_resumes_from_the_latest_complete_checkpoint(tmp_path: Path) -> None:
    from reward_trainer.sft import latest_checkpoint

    assert latest_checkpoint(tmp_path) is None
    for step, complete in ((100, True), (300, True), (400, False), (20, True)):
        d = tmp_path / f"checkpoint-{step}"
        d.mkdir()
        if complete:
            (d / "trainer_state.json").write_text("{}")
    (tmp_path / "checkpoint-x").mkdir()
    assert latest_checkpoint(tmp_path) == tmp_path / "checkpoint-300"  # 400 was cut before its state was written
