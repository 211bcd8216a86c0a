"""``compeer-loop rescore`` (compeer_loop/rescore.py): a finished loop folder copied and its evaluations compared
again by another independent scorer, FAKE scorers only (``tests.fake_engine.FakeEngine`` behind a real
:class:`evaluator.backends.ChatRole`); and the plan's ``independent_scorer base:NAME``."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from compeer_loop.plan import LoopSettings
from compeer_loop.report_runs import scored_by_training_weights
from compeer_loop.rescore import RESCORED_FILE, OpenScorer, rescore
from compeer_loop.seeds import load_replicates
from evaluator.backends import ChatRole, EngineError, roles_from_engines
from judge.engines.base import EngineConfig
from tests.fake_engine import FakeEngine
from tests.unit.loop_report_fixture import seed_folder

OLD, NEW = "Qwen/Qwen2.5-Coder-1.5B-Instruct", "Qwen/Qwen2.5-Coder-0.5B-Instruct"
SCORER = "base:qwen2.5-coder-0.5b"
#: a record the policy did not answer: never compared, kept byte for byte
UNANSWERED = {"id": "p99", "status": "engine_error", "history": [], "reference": "x", "text": "",
              "independent_status": "stale", "independent_win": 1.0}


def fake_scorer_engine(responder: Any, model_id: str = NEW) -> FakeEngine:
    """A FAKE engine whose identity is the new scorer's model id."""
    return FakeEngine(responder, config=EngineConfig(backend="fake", model_id=model_id))


def fake_open_scorer(engine: FakeEngine, cache: Path) -> OpenScorer:
    """A FAKE of :func:`compeer_loop.evaluate.scorer_role`: ``engine`` as the scorer role, answers cached per policy
    folder under ``cache`` (never in ~/.cache/compeer)."""

    @asynccontextmanager
    async def open_fake(s: LoopSettings, folder: Path) -> AsyncIterator[ChatRole | None]:
        roles = roles_from_engines({"model": engine, "simulator": engine, "scorer": engine},
                                   cache_dir=cache / folder.name)
        try:
            yield roles.scorer
        finally:
            await roles.aclose()

    return open_fake


def _records(root: Path, policy: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (root / "eval" / policy / "records.jsonl").read_text().splitlines()]


@pytest.fixture
def loop(tmp_path: Path) -> Path:
    """A finished loop folder: a, b, c evaluated by the 1.5B judge base (b trained against that bare base), one
    unanswered record in b, the old scorer's answer cache and a pid file beside them."""
    root = seed_folder(tmp_path / "loop", 0, {"a": [0.0, 0.5, 1.0, 1.0], "b": [1.0, 1.0, 0.5, 1.0],
                                              "c": [0.5, 0.0, 0.0, 1.0]})
    for policy in ("a", "b", "c"):
        path = root / "eval" / policy / "records.jsonl"
        rows = [{**r, "independent_scorer": OLD} for r in _records(root, policy)]
        rows += [UNANSWERED] if policy == "b" else []
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        (root / "eval" / policy / "compared" / "cache").mkdir(parents=True)
        (root / "eval" / policy / "compared" / "manifest.json").write_text('{"config": {"scorer": "old"}}')
    (root / "b" / "judge.json").write_text(json.dumps({"arm": "b", "judges": [
        {"server": "base", "flag": "none", "served": {"model": OLD, "revision": "r", "adapter": None}}]}))
    (root / "b" / "pid").write_text("12345")
    return root


def test_rescore_replaces_the_independent_fields_and_nothing_else(loop: Path, tmp_path: Path) -> None:
    """Every answered record gets the new scorer's comparison (this fake names A in both orders: a split, 0.5); every
    other field, every unanswered record and ROOT itself stay as they were; the plan names the new scorer; the
    shared-weights caveat no longer fires for (b), whose judge is the 1.5B base."""
    assert scored_by_training_weights(load_replicates([loop])) == ["b"]
    before = {p: (loop / "eval" / p / "records.jsonl").read_bytes() for p in ("a", "b", "c")}
    engine = fake_scorer_engine(lambda messages, params: "Better: A")
    out = tmp_path / "new"
    done = rescore(loop, out, SCORER, open_scorer=fake_open_scorer(engine, tmp_path / "cache"))
    assert {p: (loop / "eval" / p / "records.jsonl").read_bytes() for p in ("a", "b", "c")} == before
    for policy in ("a", "b", "c"):
        old, new = _records(loop, policy), _records(out, policy)
        assert [r["id"] for r in new] == [r["id"] for r in old]
        for o, n in zip(old, new):
            if o["status"] != "ok":
                assert n == o
                continue
            assert {k: v for k, v in n.items() if not k.startswith("independent_")} == \
                {k: v for k, v in o.items() if not k.startswith("independent_")}
            assert (n["independent_as_a"], n["independent_as_b"], n["independent_win"],
                    n["independent_first_position"], n["independent_status"], n["independent_scorer"]) == \
                ("A", "A", 0.5, 1.0, "ok", NEW)
    assert len(engine.calls) == 2 * 12  # both orders of each answered record, nothing for the unanswered one
    plan, old_plan = json.loads((out / "plan.json").read_text()), json.loads((loop / "plan.json").read_text())
    assert plan == {**old_plan, "independent_scorer": SCORER, "independent_scorer_adapter": "none"}
    assert LoopSettings.from_json(plan).independent_scorer == SCORER
    saved = json.loads((out / RESCORED_FILE).read_text())
    assert saved == done and saved["from"] == str(loop.resolve()) and saved["scorer"] == SCORER
    assert saved["status"] == "done" and "ESC-Eval" in saved["not_rerun"] and saved["started"] <= saved["finished"]
    assert saved["policies"]["b"]["records"] == 5 and saved["policies"]["b"]["rescored"] == 4
    assert saved["policies"]["b"]["independent_status"] == {"ok": 4}
    assert saved["policies"]["b"]["previous_scorers"] == [OLD] and saved["policies"]["b"]["scorer_identity"] == NEW
    # the old scorer's answer cache and ROOT's process ids are not copied; everything else is
    assert not (out / "b" / "pid").exists() and not (out / "eval" / "a" / "compared").exists()
    assert (out / "b" / "judge.json").read_bytes() == (loop / "b" / "judge.json").read_bytes()
    assert (out / "state.json").read_bytes() == (loop / "state.json").read_bytes()
    assert scored_by_training_weights(load_replicates([out])) == []  # 0.5B scorer, 1.5B judge: independent


def test_a_failed_answer_or_engine_error_stays_unscored(loop: Path, tmp_path: Path) -> None:
    """A record whose answer does not parse is `failed`, an engine failure `engine_error`: both with no win and no
    verdicts, whatever the old scorer said (p0 had a win of 1.0 in b)."""

    def responder(messages: list[dict[str, str]], params: Any) -> str:
        user = messages[-1]["content"]
        if "reply 0 " in user:
            return "Both are fine."
        if "reply 1 " in user:
            raise EngineError("engine_error: the fake engine fails")
        return "Better: B"

    out = tmp_path / "new"
    done = rescore(loop, out, SCORER, policies=["b"], open_scorer=fake_open_scorer(fake_scorer_engine(responder),
                                                                                      tmp_path / "cache"))
    rows = {r["id"]: r for r in _records(out, "b")}
    assert rows["p0"]["independent_status"] == "failed" and rows["p0"]["independent_win"] is None
    assert rows["p0"]["independent_as_a"] is None and rows["p0"]["independent_as_b"] is None
    assert rows["p1"]["independent_status"] == "engine_error" and rows["p1"]["independent_win"] is None
    assert "independent_error" in rows["p1"] and rows["p1"]["independent_first_position"] is None
    assert rows["p2"]["independent_win"] == 0.5 and rows["p99"] == UNANSWERED
    assert done["policies"]["b"]["independent_status"] == {"failed": 1, "engine_error": 1, "ok": 2}
    assert list(done["policies"]) == ["b"]  # only the policies asked for ...
    assert _records(out, "a") == _records(loop, "a")  # ... the others copied as they were


def test_a_killed_rescore_resumes_and_skips_the_finished_policies(loop: Path, tmp_path: Path) -> None:
    """A failure that is no engine error stops the run: the policy it hit keeps its old records (written atomically),
    the same command then finishes only what was not done."""
    def broken(messages: list[dict[str, str]], params: Any) -> str:
        if "c says" in messages[-1]["content"]:
            raise RuntimeError("killed")
        return "Better: A"

    out = tmp_path / "new"
    with pytest.raises(RuntimeError):
        rescore(loop, out, SCORER, open_scorer=fake_open_scorer(fake_scorer_engine(broken), tmp_path / "c1"))
    state = json.loads((out / RESCORED_FILE).read_text())
    assert state["status"] == "running" and list(state["policies"]) == ["a", "b"]
    assert _records(out, "c") == _records(loop, "c") and not list((out / "eval" / "c").glob(".*tmp"))
    assert json.loads((out / "plan.json").read_text())["independent_scorer"] == "judge-base"  # not yet
    engine = fake_scorer_engine(lambda messages, params: "Better: A")
    done = rescore(loop, out, SCORER, open_scorer=fake_open_scorer(engine, tmp_path / "c2"))
    assert done["status"] == "done" and list(done["policies"]) == ["a", "b", "c"]
    assert {c.messages[-1]["content"].count("c says") for c in engine.calls} == {1}  # c's records only
    assert all(r["independent_scorer"] == NEW for r in _records(out, "c"))
    with pytest.raises(ValueError, match="exists and is not empty"):  # a finished one is not run again
        rescore(loop, out, SCORER, open_scorer=fake_open_scorer(engine, tmp_path / "c3"))


def test_what_rescore_refuses_before_copying_anything(loop: Path, tmp_path: Path) -> None:
    from compeer_loop.cli import main

    engine = fake_scorer_engine(lambda messages, params: "Better: A")
    opened = fake_open_scorer(engine, tmp_path / "cache")
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "notes.md").write_text("someone's folder")
    with pytest.raises(ValueError, match="exists and is not empty"):
        rescore(loop, busy, SCORER, open_scorer=opened)
    assert [p.name for p in busy.iterdir()] == ["notes.md"]
    assert main(["rescore", "--root", str(loop), "--out", str(busy), "--scorer", SCORER]) == 2  # the CLI says so
    for scorer, message in (("base:gpt-5", "no base 'gpt-5'"), ("none", "nothing to re-score with")):
        with pytest.raises(ValueError, match=message):
            rescore(loop, tmp_path / "never", scorer, open_scorer=opened)
    with pytest.raises(ValueError, match="is inside --root"):
        rescore(loop, loop / "rescored", SCORER, open_scorer=opened)
    with pytest.raises(ValueError, match="concurrency must be >= 1"):
        rescore(loop, tmp_path / "never", SCORER, concurrency=0, open_scorer=opened)
    with pytest.raises(ValueError, match="no evaluation records of d"):
        rescore(loop, tmp_path / "never", SCORER, policies=["a", "d"], open_scorer=opened)
    assert not (tmp_path / "never").exists() and not engine.calls
    empty = tmp_path / "empty"  # an existing empty folder is fine
    empty.mkdir()
    assert rescore(loop, empty, SCORER, policies=["a"], open_scorer=opened)["status"] == "done"


def test_the_plan_takes_a_named_base_as_independent_scorer() -> None:
    assert LoopSettings(independent_scorer="base:qwen2.5-coder-0.5b").independent_scorer == "base:qwen2.5-coder-0.5b"
    assert LoopSettings(independent_scorer="base:smollm2-135m").independent_scorer == "base:smollm2-135m"
    with pytest.raises(ValueError, match=r"no base 'gpt-5' in judge/bases.py; expected base:smollm2-135m, "
                                         r"base:qwen2.5-coder-1.5b, base:qwen2.5-coder-0.5b, judge-base, none"):
        LoopSettings(independent_scorer="base:gpt-5")
    with pytest.raises(ValueError, match="served bare"):
        LoopSettings(independent_scorer="base:qwen2.5-coder-0.5b", independent_scorer_adapter="some-rater")
    with pytest.raises(ValueError, match="training judge's adapter"):  # the old refusal stands
        LoopSettings(independent_scorer="judge-base", independent_scorer_adapter="default")


def test_a_named_base_scorer_is_that_base_bare_with_its_own_identity(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """``base:NAME`` resolves to that base's converted folder, no adapter; its identity (what records name and
    ``scored_by_training_weights`` compares with a bare judge's model) is the base's model id, the 0.5B's not the
    1.5B's. The folders stand in for the converted bases (nothing is converted here)."""
    import judge.model_store as store
    from compeer_loop.independent import scorer_spec
    from evaluator.backends import resolve_spec
    from judge.bases import BASES, Base

    def converted(base: Base, dtype: str = "float32") -> store.ModelRef:
        folder = tmp_path / base.folder
        folder.mkdir(exist_ok=True)
        (folder / "compeer_model.json").write_text(json.dumps({"model_id": base.model_id, "revision": "r"}))
        return store.ModelRef(str(folder), base.model_id, "r")

    monkeypatch.setattr(store, "prepare_base", converted)
    identities = {}
    for name in ("qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"):
        spec = scorer_spec(LoopSettings(independent_scorer=f"base:{name}", device="cpu"))
        assert spec is not None and spec.model == str(tmp_path / BASES[name].folder) and spec.adapter == "none"
        identities[name] = resolve_spec(spec).identity
    assert identities == {"qwen2.5-coder-0.5b": NEW, "qwen2.5-coder-1.5b": OLD}
    judge_base = scorer_spec(LoopSettings(independent_scorer="judge-base", device="cpu"))
    assert judge_base is not None and judge_base.model == str(tmp_path / BASES["smollm2-135m"].folder)


def test_the_report_credits_the_scorer_check_only_to_the_scorer_it_measured() -> None:
    """The contrast-group check measured `judge-base`; a re-scored report names its own scorer and does not borrow
    that check's verdict."""
    from compeer_loop.report_checks import _scorer_check_line

    assert "ranks the real reply above worse kinds" in _scorer_check_line("judge-base")
    other = _scorer_check_line("base:qwen2.5-coder-0.5b")
    assert "ranks the real reply" not in other and "`base:qwen2.5-coder-0.5b`" in other and "`judge-base`" in other
