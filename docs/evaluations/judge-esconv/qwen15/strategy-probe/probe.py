"""Is the strategy a reply carries out readable from the reply at all? A linear probe on all-MiniLM-L6-v2 sentence
embeddings (the service's embedding model), trained on every annotated supporter utterance of ESConv train and
measured on valid: 8-way accuracy beside the majority baseline and Cohen's kappa, and the AUC of the probe's
probability of the *named* strategy between a candidate naming the reply's annotated strategy and one naming another
(the contrast kind `unused_strategy`, where the trained 1.5B judges score 0.50-0.51). A bound from below on what a
judge could read, not a judge: it sees the reply alone (optionally with the seeker's last turn).
    PYTHONPATH=. .venv/bin/python docs/evaluations/judge-esconv/qwen15/strategy-probe/probe.py ../shared/data/esconv \
        docs/evaluations/judge-esconv/qwen15/strategy-probe/probe.json          # from the repository root"""
import json
import sys
from pathlib import Path

import numpy as np
from sentence_transformers import SentenceTransformer
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import cohen_kappa_score, f1_score

from data_builder.silver_text import load_config
from judge.model_store import default_embedding_path

STAGE = load_config().strategy_stage  # the support stage of each strategy (silver.yaml `strategy_stage`)


def utterances(path: Path, context: bool) -> tuple[list[str], list[str]]:
    texts, labels = [], []
    for d in json.loads(path.read_text()):
        last_seeker = ""
        for turn in d["dialog"]:
            if turn["speaker"] == "seeker":
                last_seeker = turn["content"]
                continue
            strategy = (turn.get("annotation") or {}).get("strategy")
            if strategy:
                texts.append(f"Seeker: {last_seeker}\nSupporter: {turn['content']}" if context else turn["content"])
                labels.append(strategy)
    return texts, labels


def main() -> None:
    root, out = Path(sys.argv[1]), Path(sys.argv[2])
    model = SentenceTransformer(default_embedding_path(), device="cpu")
    result = {}
    for context in (False, True):
        xtr, ytr = utterances(root / "train.json", context)
        xva, yva = utterances(root / "valid.json", context)
        etr, eva = (model.encode(x, batch_size=128, normalize_embeddings=True) for x in (xtr, xva))
        clf = LogisticRegression(max_iter=3000, C=4.0).fit(etr, ytr)
        pred, proba = clf.predict(eva), clf.predict_proba(eva)
        classes = list(clf.classes_)
        majority = max(set(ytr), key=ytr.count)
        idx = {c: i for i, c in enumerate(classes)}
        wins = ties = pairs = 0
        for p, y in zip(proba, yva):
            for z in classes:
                if z != y:
                    pairs += 1
                    wins += p[idx[y]] > p[idx[z]]
                    ties += p[idx[y]] == p[idx[z]]
        stage_true = [STAGE.get(y, "other") for y in yva]
        stage_pred = [STAGE.get(y, "other") for y in pred]
        result["reply_with_seeker_turn" if context else "reply_alone"] = {
            "train_utterances": len(ytr), "valid_utterances": len(yva),
            "accuracy": float(np.mean([a == b for a, b in zip(pred, yva)])),
            "majority_strategy": majority, "majority_accuracy": float(np.mean([y == majority for y in yva])),
            "macro_f1": float(f1_score(yva, pred, average="macro")), "kappa": float(cohen_kappa_score(yva, pred)),
            "unused_strategy_auc": (wins + 0.5 * ties) / pairs,
            "stage_accuracy": float(np.mean([a == b for a, b in zip(stage_pred, stage_true)])),
            "stage_kappa": float(cohen_kappa_score(stage_true, stage_pred)),
        }
        print(json.dumps(result, indent=1))
    out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
