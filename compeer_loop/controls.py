"""Controls that are what they say (issue 26, item 1): before a GRPO arm trains, the driver asks each of its judge
servers what it serves (``GET /v1/info``, the HTTP mirror of gRPC ``Info``) and checks it against what the plan
says that judge is, then scores a fixed probe through it and records the reward components' means.

- :func:`expected_judge`: what a :class:`~compeer_loop.plan.JudgeServer` must serve, derived from the plan alone:
  the judge base ``--model default`` stands for on the plan's device (model id; its revision names the pinned GGUF's
  sha256), and the adapter: none for ``--adapter none`` (arm b's untrained base judge), the shipped adapter's id
  (``name@sha256:<12>``) for ``default``, a PEFT folder's id for the PRM/ORM judges.
- :func:`check_served`: a served ``Info`` against that; a mismatch raises :class:`JudgeControlError` naming expected
  and served, and the arm is stopped before it trains.
- :func:`probe_groups` / :func:`score_probe`: the probe, ``judge_probe_groups`` warm-up rows of the arm's prompt
  set, each a group of two CER candidates (the row's own gold-facts target, and the next row's: another dialogue's)
  against the row's real supporter turn; the means of every component (discrete and graded, as the trainer logs
  them), and the total of the own and the other candidate, so the report can show what each arm's judge rewards.
  A probe that scores no candidate is recorded (with a warning), not a mismatch.
- :func:`verify_arm`: all of it for one arm, written to ``ROOT/<arm>/judge.json`` (the arm's judge record, read by
  the status, copied by ``compeer-loop merge``, shown by the report).
"""

from __future__ import annotations

import json
import logging
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path
from statistics import fmean
from typing import Any

from cer.reasoning import parse
from compeer_loop.plan import Arm, JudgeServer, LoopSettings
from compeer_loop.prompts import WARMUP_FILE, read_jsonl
from judge.model_store import (  # the named bases through the model store (the loop's door to judge models)
    BASES,
    DEFAULT_ADAPTER,
    DEFAULT_MODEL,
    NO_ADAPTER,
    adapter_id,
    base_adapter_dir,
    judge_base_name,
)

log = logging.getLogger(__name__)
JUDGE_FILE = "judge.json"
#: the judge mode a server is probed in (the mode its arm trains with)
PROBE_MODE = {"prm": "prm", "orm": "orm"}
#: Info fields recorded beside the identity
SERVED_FIELDS = ("model", "revision", "adapter", "backend", "template_version", "graded", "embedding_model",
                 "independent_rounds", "answer_prefix", "verdict_temperature")


class JudgeControlError(RuntimeError):
    """A judge server does not serve what the arm's plan says, or cannot be probed: the arm must not train."""


@dataclass(frozen=True)
class ExpectedJudge:
    """What one judge server must serve: ``model`` (id), ``revision_hash`` (``sha256:<12>`` of the base's pinned GGUF,
    which the served revision must name) and ``adapter`` (None: the bare base)."""

    server: str
    model: str
    revision_hash: str
    adapter: str | None


def expected_judge(j: JudgeServer, s: LoopSettings) -> ExpectedJudge:
    """The judge ``server_argv`` asks ``j`` to serve (``--model default --adapter j.adapter`` on ``s.device``).

    Raises :class:`JudgeControlError` when the plan names an adapter that is no PEFT folder here."""
    base = BASES[str(judge_base_name(DEFAULT_MODEL, s.device))]
    if j.adapter == NO_ADAPTER:
        adapter = None
    elif j.adapter == DEFAULT_ADAPTER:
        adapter = adapter_id(str(base_adapter_dir(base))) if base.adapter is not None else None
    else:
        try:
            adapter = adapter_id(j.adapter)
        except FileNotFoundError as exc:
            raise JudgeControlError(f"judge {j.name}: {exc}") from None
    return ExpectedJudge(j.name, base.model_id, f"sha256:{base.sha256[:12]}", adapter)


def check_served(expected: ExpectedJudge, info: dict[str, Any]) -> None:
    """Raise :class:`JudgeControlError` unless ``info`` (``/v1/info``) serves ``expected``'s base, revision and
    adapter (an empty adapter counts as none), judging its rounds in sequence as it was trained to (never
    ``--independent-rounds``: another judge)."""
    served_adapter = info.get("adapter") or None
    wrong = []
    if info.get("model") != expected.model:
        wrong.append(f"model {expected.model!r} expected, {info.get('model')!r} served")
    if expected.revision_hash not in str(info.get("revision", "")):
        wrong.append(f"a revision naming {expected.revision_hash} expected, {info.get('revision')!r} served")
    if served_adapter != expected.adapter:
        want = expected.adapter or "none (the bare base)"
        wrong.append(f"adapter {want} expected, {served_adapter or 'none (the bare base)'} served")
    if info.get("independent_rounds"):
        wrong.append("sequential rounds expected, independent rounds served (--independent-rounds)")
    if wrong:
        raise JudgeControlError(f"judge {expected.server} does not serve what the plan says: " + "; ".join(wrong))


def _http(server: JudgeServer, path: str, body: dict[str, Any] | None, timeout_s: float) -> dict[str, Any]:
    url = f"http://127.0.0.1:{server.http_port}{path}"
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"} if data else {})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as r:
            out = json.loads(r.read().decode())
    except urllib.error.HTTPError as exc:
        raise JudgeControlError(f"judge {server.name}: {url} answered {exc.code}: {exc.read()[:300]!r}") from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise JudgeControlError(f"judge {server.name}: {url} failed: {exc}") from None
    if not isinstance(out, dict):
        raise JudgeControlError(f"judge {server.name}: {url} answered no JSON object")
    return out


def fetch_info(server: JudgeServer, timeout_s: float = 10.0) -> dict[str, Any]:
    """The server's ``GET /v1/info`` (gRPC ``Info``)."""
    return _http(server, "/v1/info", None, timeout_s)


def probe_groups(prompts: Path, mode: str = "unified", n: int = 8) -> list[dict[str, Any]]:
    """The probe: ``n`` groups from the first warm-up rows, each [own gold-facts CER target, the next row's]
    against the row's real supporter turn (the own target's ``<response>``)."""
    path = prompts / WARMUP_FILE
    if not path.is_file():
        raise JudgeControlError(f"no probe: {path} is missing (the prompt sets of `compeer-loop prompts`)")
    rows = read_jsonl(path)[: n + 1]
    if len(rows) < 2:
        raise JudgeControlError(f"no probe: {path} has fewer than two rows")
    groups = []
    for i, row in enumerate(rows[:n]):
        other = rows[(i + 1) % len(rows)]
        groups.append({"history": [{"role": t["role"], "text": t["text"]} for t in row["history"]],
                       "reference": parse(row["target"]).parts.get("response") or "",
                       "candidates": [row["target"], other["target"]],
                       "options": {"mode": mode, "include_similarity": False}})
    return groups


def _mean(values: list[float | None]) -> float | None:
    kept = [float(v) for v in values if v is not None]
    return fmean(kept) if kept else None


def probe_means(response: dict[str, Any]) -> dict[str, Any]:
    """Component means over the probe's scored candidates (``/v1/score:batch`` answer), discrete and graded, and the
    total of the own (first) and the other (second) candidate."""
    results = [(i, r) for g in response.get("groups", []) if "results" in g for i, r in enumerate(g["results"])]
    ok = [(i, r) for i, r in results if r.get("status") == "ok"]
    out: dict[str, Any] = {"candidates": len(results), "ok": len(ok),
                           "errors": sum(1 for g in response.get("groups", []) if "error" in g)}
    for kind in ("rewards", "graded_rewards"):
        prefix = "" if kind == "rewards" else "graded_"
        rw = [(i, r.get(kind)) for i, r in ok if r.get(kind)]
        out[f"{prefix}step"] = _mean([v for _, x in rw for v in x.get("steps") or []])
        for comp in ("preference", "format", "total"):
            out[f"{prefix}{comp}"] = _mean([x.get(comp) for _, x in rw])
        out[f"{prefix}total_own"] = _mean([x.get("total") for i, x in rw if i == 0])
        out[f"{prefix}total_other"] = _mean([x.get("total") for i, x in rw if i == 1])
    return out


def score_probe(server: JudgeServer, groups: list[dict[str, Any]], timeout_s: float = 600.0) -> dict[str, Any]:
    """Score the probe on ``server`` (``POST /v1/score:batch``); the raw answer."""
    return _http(server, "/v1/score:batch", {"groups": groups}, timeout_s)


def run_probe(server: JudgeServer, s: LoopSettings, info: dict[str, Any]) -> dict[str, Any]:
    """The probe on one server: its means, and the identity every scored group's ``meta`` names (it must be the
    one ``info`` named)."""
    mode = PROBE_MODE.get(server.name, "unified")
    answer = score_probe(server, probe_groups(Path(s.prompts), mode, s.judge_probe_groups))
    means = probe_means(answer)
    if not means["ok"]:  # recorded (the report shows n/a means), not a mismatch: the arm's own reward calls decide
        log.warning("judge %s: the probe scored none of its %d candidates (%d group errors; see logs/server-%s.log)",
                    server.name, means["candidates"], means["errors"], server.name)
    for g in answer.get("groups", []):
        meta = g.get("meta") or {}
        if "results" in g and ((meta.get("adapter") or None) != (info.get("adapter") or None)
                               or meta.get("model") != info.get("model")):
            raise JudgeControlError(f"judge {server.name}: the probe was scored by {meta.get('model')!r} adapter "
                                    f"{meta.get('adapter')!r}, not the {info.get('model')!r} adapter "
                                    f"{info.get('adapter')!r} its Info names")
    return {"mode": mode, "groups": len(answer.get("groups", [])), "at": time.time(), **means}


def _identity(served: dict[str, Any]) -> tuple[Any, ...]:
    return served.get("model"), served.get("revision"), served.get("adapter") or None


def verify_arm(arm: Arm, s: LoopSettings, servers: dict[str, JudgeServer], out: Path,
               probes: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Check every judge of ``arm`` (see the module docstring) and write ``out/judge.json``; return the record.

    ``probes`` caches each server's probe for this driver (c, d and e share a server). An arm resumed after a
    checkpoint keeps the probe taken before it first trained, and must find the same judge it trained against then.
    Raises :class:`JudgeControlError` (the arm must not train)."""
    path = out / JUDGE_FILE
    old = json.loads(path.read_text()) if path.exists() else {}
    old_by_server = {j["server"]: j for j in old.get("judges", [])}
    judges = []
    for name in arm.judges:
        server = servers[name]
        expected = expected_judge(server, s)
        info = fetch_info(server)
        check_served(expected, info)
        served = {k: info.get(k) for k in SERVED_FIELDS}
        before = old_by_server.get(name)
        if before is not None and _identity(before["served"]) != _identity(served):
            raise JudgeControlError(f"arm {arm.name} trained against {_identity(before['served'])} before its restart "
                                    f"and judge {name} now serves {_identity(served)}: not one arm")
        if before is not None and before.get("probe"):
            probe = before["probe"]
        else:
            probe = probes.get(name) or run_probe(server, s, info)
        probes[name] = probe
        judges.append({"server": name, "address": server.address, "flag": server.adapter,
                       "expected": asdict(expected), "served": served, "probe": probe})
    record = {"arm": arm.name, "judges": judges, "verified_at": [*old.get("verified_at", []), time.time()]}
    out.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record, indent=1) + "\n")
    tmp.replace(path)
    return record


def read_judge_record(arm_dir: Path) -> dict[str, Any] | None:
    """``ARM/judge.json`` (None when the arm was never verified)."""
    path = arm_dir / JUDGE_FILE
    return json.loads(path.read_text()) if path.exists() else None
