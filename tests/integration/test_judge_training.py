"""Judge SFT end to end on CPU: a few LoRA steps on a small judge SFT set; the adapter is a PEFT folder that loads
through the transformers engine inside the serving Judge and changes what it says; the evaluation report carries
every Table 1 column. Real model (SmolLM2-135M), real TRL, real engine; about 2-3 minutes on one core."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from tests.unit.test_reward_trainer_fixtures import write_judge_sft

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _judge_turn_nll(model_path: str, adapter: str | None, messages: list[dict[str, str]]) -> float:
    """Mean negative log-likelihood of the judge's turns (the SFT loss) under base or base + adapter."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from reward_trainer.data import judge_turn_labels

    tok = AutoTokenizer.from_pretrained(model_path, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32, local_files_only=True)
    if adapter:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, adapter)
    enc = judge_turn_labels(tok, messages)
    with torch.inference_mode():
        out = model(input_ids=torch.tensor([enc["input_ids"]]), labels=torch.tensor([enc["labels"]]))
    return float(out.loss)


def test_sft_adapter_loads_in_the_judge_and_evaluation_reports(tmp_path: Path) -> None:
    from datasets import load_from_disk
    from safetensors.torch import load_file

    from judge.factory import EngineChoice
    from judge.protocol import DEFAULT_TEMPLATE, JudgeSettings
    from reward_trainer.cli import main
    from reward_trainer.metrics import METRIC_KEYS
    from reward_trainer.predict import JudgeRuntime, items_from_rows, make_judge, open_engine, predict
    from reward_trainer.report import COLUMNS

    data = write_judge_sft(tmp_path / "judge_sft", n_train=6, n_heldout=2, modes=("unified",))
    adapter = tmp_path / "adapter"
    # 1. train: two optimizer steps of the cpu-smoke profile (a higher LR so two steps visibly move the judge)
    profile = tmp_path / "smoke.yaml"
    from reward_trainer.config import read_profile

    mapping = {**read_profile("cpu-smoke"), "learning_rate": 2.0e-3}
    profile.write_text(json.dumps(mapping))
    assert main(["judge", "--config", str(profile), "--data", str(data), "--out", str(adapter),
                 "--max-steps", "2"]) == 0

    # a standard PEFT adapter folder, with trained (non-zero) LoRA B matrices and our stamp
    assert (adapter / "adapter_config.json").is_file() and (adapter / "adapter_model.safetensors").is_file()
    weights = load_file(str(adapter / "adapter_model.safetensors"))
    lora_b = [t for k, t in weights.items() if "lora_B" in k]
    assert lora_b and any(float(t.abs().max()) > 0 for t in lora_b)  # B starts at zero: non-zero = trained
    stamp = json.loads((adapter / "compeer_judge.json").read_text())
    assert stamp["variant"] == "unified" and stamp["steps"] == 2 and stamp["template_version"] == DEFAULT_TEMPLATE

    # 2. the adapter lowers the loss of the judge's turns (computed on a training conversation)
    from judge.model_store import resolve_model

    base_path = resolve_model("default").path
    train_msgs = load_from_disk(str(data / "unified"))["train"][0]["messages"]
    assert _judge_turn_nll(base_path, str(adapter), train_msgs) < _judge_turn_nll(base_path, None, train_msgs)

    # 3. through the serving path: the same Judge on the transformers engine, base vs base + adapter
    items = items_from_rows(load_from_disk(str(data / "unified"))["heldout"], max_items=1)
    runtime = JudgeRuntime(engine=EngineChoice(backend="transformers", device="cpu"),
                           settings=JudgeSettings(max_tokens_per_component=20, max_retries=0, seed=0))

    async def judge_texts(adapter_dir: str | None) -> list[str]:
        async with open_engine(runtime, adapter_dir) as engine:
            preds = await predict(make_judge(engine, runtime), items, "unified")
        return preds[0].texts

    base_texts = asyncio.run(judge_texts(None))
    tuned_texts = asyncio.run(judge_texts(str(adapter)))
    assert len(base_texts) == len(tuned_texts) == 4
    assert base_texts != tuned_texts

    # 4. the evaluation report: trained, base and majority rows with every column
    out = tmp_path / "eval"
    assert main(["judge-eval", "--adapter", str(adapter), "--data", str(data), "--out", str(out), "--device", "cpu",
                 "--max-items", "1", "--max-tokens", "20", "--max-retries", "0", "--save-texts"]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    rows = [json.loads(ln) for ln in (out / "predictions.jsonl").read_text().splitlines()]
    trained = [r for r in rows if r["judge"] == "trained" and r["variant"] == "unified"]
    assert len(trained) == 1 and len(trained[0]["texts"]) == 4  # --save-texts: the four rounds' outputs
    entry = metrics["unified"]
    assert entry["judge"] == "trained" and entry["adapter"] == str(adapter)
    assert set(METRIC_KEYS) <= set(entry)
    assert set(entry["baselines"]) == {"base", "majority"}
    for row in (entry, *entry["baselines"].values()):
        assert len(row["step_weighted_f1"]) == 3 and len(row["step_false_recall"]) == 3
        assert row["parse_failure_rate"] is not None
    # the surface-cue table of both judged judges: the one item counted once, in its part's table
    for judge in ("trained", "base"):
        assert sum(c["items"] for t in entry["cues"][judge].values() for c in t["cells"].values()) == 1
    report = (out / "report.md").read_text()
    assert "## Surface cue" in report
    for col in COLUMNS:
        assert col in report
    for judge in ("trained", "base", "majority"):
        assert f"| unified | {judge} |" in report
        assert (out / f"confusion_unified_{judge}.png").is_file()
