"""The ESConv judge's data and measures: mode-reply rows, contrast groups, the reward AUC, model identity by weights."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cer.reasoning import parse
from cer.taxonomy import load_taxonomy
from data_builder.contrast import NEGATIVE_KINDS, POLICY_KINDS, build_contrast
from data_builder.emit import build_judge_sft
from data_builder.negatives import HACK_KINDS
from data_builder.silver import build_silver
from data_builder.silver_text import load_config
from reward_trainer.contrast import auc, render_markdown, summarise, summarise_kinds


def test_reply_rows_render_only_in_reply_mode(corpus: tuple[list[dict], list[dict]]) -> None:
    rounds, dialogues = corpus
    items, _ = build_silver(rounds, load_taxonomy(), load_config(), seed=0, dialogues=dialogues)
    sets = build_judge_sft(items, modes=["unified", "reply"], heldout_fraction=0.0)
    reply, unified = sets["reply"]["train"], sets["unified"]["train"]
    assert len(reply) == sum("reply" in it["labels"] for it in items) and len(unified) == len(rounds)
    row = reply[0]
    assert [m["role"] for m in row["messages"]] == ["system", "user", "assistant"]
    assert row["labels"]["reply"] in (True, False) and row["labels"]["step1"] is None
    assert row["messages"][-1]["content"].endswith(f"Verdict: {row['labels']['reply']}")
    assert "Is this a good next supporter turn" in row["messages"][1]["content"]


def test_contrast_negatives_differ_from_the_positive_in_one_part(corpus: tuple[list[dict], list[dict]]) -> None:
    rounds, dialogues = corpus
    groups, counts = build_contrast(rounds, load_taxonomy(), load_config(), seed=0, dialogues=dialogues)
    assert counts["groups"] == len(groups) > 0
    part_of = {"similar_problem": "analysis", "wrong_emotion": "emotion", "unused_strategy": "strategy",
               "stage_mismatch": "strategy",
               **{k: "response" for k in ("other_round", "other_dialogue", *HACK_KINDS, *POLICY_KINDS)}}
    for g in groups:
        pos = parse(g["candidates"]["positive"])
        assert pos.ok and pos.response == g["references"]["gold"] and g["strategy"] in pos.parts["strategy"]
        assert g["references"]["other_round"] != g["references"]["gold"]
        for kind in NEGATIVE_KINDS:
            if kind not in g["candidates"]:
                continue
            neg = parse(g["candidates"][kind])
            differ = {p for p in ("analysis", "emotion", "strategy", "response") if neg.parts[p] != pos.parts[p]}
            assert differ == {part_of[kind]}, (kind, differ)
        if "other_round" in g["candidates"]:  # two different replies of other rounds of the same dialogue
            assert parse(g["candidates"]["other_round"]).response != g["references"]["other_round"]
    assert build_contrast(rounds, load_taxonomy(), load_config(), seed=0, dialogues=dialogues)[0] == groups


def test_auc_and_within_group_shares_by_hand() -> None:
    assert auc([1.0, 3.0], [1.0, 0.0]) == pytest.approx((0.5 + 1 + 1 + 1) / 4)
    assert auc([], [1.0]) is None
    totals = [{"positive": 5.0, "other_round": 3.0, "wrong_emotion": 5.0},
              {"positive": 1.0, "other_round": None, "wrong_emotion": 3.0},
              {"positive": None, "other_round": 1.0}]
    s = summarise(totals)
    assert s["positive_unscored"] == 1 and s["positive_mean_total"] == 3.0
    assert s["other_round"]["negative_unscored"] == 1 and s["other_round"]["auc"] == pytest.approx((1 + 1 + 0 + 0.5) / 4)
    assert s["other_round"]["within_group"] == {"n": 1, "win": 1.0, "tie": 0.0, "loss": 0.0}
    assert s["wrong_emotion"]["within_group"] == {"n": 2, "win": 0.0, "tie": 0.5, "loss": 0.5}
    assert s["kinds"] == ["wrong_emotion", "other_round"] and "similar_problem" not in s  # NEGATIVE_KINDS order


def test_contrast_reports_both_totals_for_any_kind_of_negative() -> None:
    """Kinds :data:`NEGATIVE_KINDS` does not name (``novel_b``, ``novel_a``) are reported after the known ones, in
    first-seen order, and the graded total's AUC sits beside the discrete one (a missing graded total is unscored,
    not filled in)."""
    def group(pos: tuple[float, float | None], **neg: tuple[float, float | None]) -> dict[str, dict[str, float | None]]:
        return {k: {"discrete": d, "graded": g} for k, (d, g) in {"positive": pos, **neg}.items()}

    totals = [group((5.0, 4.2), novel_b=(5.0, 3.0), other_round=(5.0, 1.0)),
              group((5.0, 3.9), novel_a=(-1.0, -0.5), novel_b=(5.0, None))]
    s = summarise_kinds(totals)
    assert "other_round" in NEGATIVE_KINDS and "novel_b" not in NEGATIVE_KINDS
    assert s["discrete"]["kinds"] == s["graded"]["kinds"] == ["other_round", "novel_b", "novel_a"]
    assert s["discrete"]["novel_b"]["auc"] == 0.5 and s["graded"]["novel_b"]["auc"] == 1.0  # certainty breaks ties
    assert s["graded"]["novel_b"]["negative_unscored"] == 1 and s["discrete"]["novel_b"]["negative_unscored"] == 0
    table = render_markdown({"judges": {"trained": {"gold": s}}})
    assert "| trained | gold | novel_b | 0.500 | 1.000 |" in table and "| novel_a |" in table


def test_local_folders_are_identified_by_their_weights(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two fine-tunes saved under the same folder name never share a revision (and so never share cache keys)."""
    from cer.modes import JudgeMode
    from judge.conversation import Judge
    from judge.engines.base import EngineConfig
    from judge.model_store import resolve_model
    from judge.protocol import JudgeSettings, load_template
    from reward_server.cache import cache_key
    from tests.fake_engine import FakeEngine

    monkeypatch.setenv("COMPEER_CACHE", str(tmp_path / "cache"))

    def folder(root: str, weights: bytes) -> Path:
        d = tmp_path / root / "judge"
        d.mkdir(parents=True)
        (d / "config.json").write_text(json.dumps({"model_type": "llama"}))
        (d / "model.safetensors").write_bytes(weights)
        return d

    a, b, c = folder("a", b"\x00" * 64), folder("b", b"\x00" * 63 + b"\x01"), folder("c", b"\x00" * 64)
    ra, rb, rc = (resolve_model(str(x)) for x in (a, b, c))
    assert ra.model_id == rb.model_id == "judge" and ra.revision != rb.revision and ra.revision == rc.revision
    judges = [Judge(FakeEngine(config=EngineConfig(backend="fake", model_id=r.model_id, revision=r.revision)),
                    load_template(), load_taxonomy(), JudgeSettings()) for r in (ra, rb)]
    keys = {cache_key(j, JudgeMode.UNIFIED, [], "ref", parse("<response>cand</response>")) for j in judges}
    assert len(keys) == 2
    # the digest is remembered per file version: rewriting the weights changes the revision
    (a / "model.safetensors").write_bytes(b"\x02" * 64)
    assert resolve_model(str(a)).revision not in (ra.revision, rb.revision)


def test_contrast_judges_only_the_references_asked_for(corpus: tuple[list[dict], list[dict]], tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """``--references gold`` judges every candidate against the gold reference alone (half the judgments of the
    default); an unknown reference is refused by name before anything is judged."""
    import asyncio
    import contextlib

    from data_builder.records import write_jsonl
    from reward_trainer import contrast
    from tests.fake_engine import FakeEngine
    from tests.unit.fakes import scripted_judge

    rounds, dialogues = corpus
    groups, _ = build_contrast(rounds, load_taxonomy(), load_config(), seed=0, dialogues=dialogues)
    path = tmp_path / "groups.jsonl"
    write_jsonl(path, groups[:2])
    engines: list[FakeEngine] = []

    @contextlib.asynccontextmanager
    async def fake_open_engine(runtime, adapter):  # type: ignore[no-untyped-def]
        engine = FakeEngine(scripted_judge())
        await engine.start()
        engines.append(engine)
        yield engine

    monkeypatch.setattr(contrast, "open_engine", fake_open_engine)
    out = {}
    for refs in (("gold",), contrast.REFERENCES):
        opts = contrast.ContrastOptions(path, tmp_path / "-".join(refs), {"trained": None}, references=refs)
        out[refs] = asyncio.run(contrast.run_contrast(opts))
    gold_only, both = out[("gold",)], out[contrast.REFERENCES]
    assert list(gold_only["judges"]["trained"]) == ["gold"] and gold_only["meta"]["references"] == ["gold"]
    assert list(both["judges"]["trained"]) == list(contrast.REFERENCES)
    assert gold_only["judges"]["trained"]["gold"] == both["judges"]["trained"]["gold"]
    assert 0 < len(engines[0].calls) and 2 * len(engines[0].calls) == len(engines[1].calls)
    with pytest.raises(ValueError, match="references \\['gold', 'silver'\\]: expected one or more of gold, other_round"):
        contrast.ContrastOptions(path, tmp_path / "x", {"trained": None}, references=("gold", "silver"))
