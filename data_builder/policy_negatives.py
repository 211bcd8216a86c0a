"""Stage ``policy-negatives``: what GRPO policies really wrote to game the judge, marked by rule, as negative replies.

Input: folders holding either kind of file, every one below the folder read:
- COMPEER loop folders (``compeer-loop``; e.g. an extracted ``results.tar.xz``) hold ``eval/<policy>/records.jsonl``:
  one policy's reply per evaluation prompt (``id`` = ``<dialogue id>#r<round>``, ``history``, ``text`` = the reply,
  ``raw``, ``format_ok``); policy = the file's folder name.
- GRPO output folders (``compeer-train grpo`` with ``log_completions_file``) hold ``completions.jsonl`` (and
  ``completions.rankR.jsonl``): every completion a training run wrote, raw (``dialogue_id``, ``round_index``,
  ``text``); its reply is its ``<response>`` part (:func:`cer.reasoning.reply_text`), its conversation the turns of
  its dialogue before that round (from ``--dialogues``); policy = ``grpo``. Lines without ``round_index`` (files of
  older runs) are skipped and counted.
The split of a prompt (``train`` | ``valid``) is that of its dialogue in the ``--dialogues SPLIT=FILE`` ingest
outputs; prompts of other dialogues are skipped and counted.

:class:`Labeller` marks a reply by the first rule that holds (thresholds and word lists: ``silver.yaml``
``policy_labeller``): ``empty``, ``stage_label``, ``judge_wording``, ``repetition``, ``truncated`` (kind
``degenerate``), ``dismissive`` (``dismissive``), ``echo`` (``echo``), ``template`` (the kind of the rule-made text
it repeats), ``short_no_content``, ``repeated_across_prompts`` (``generic``); with ``--stage-misfit``, last,
``stage_misfit`` (``misfit``): a format-valid reply whose ``<strategy>`` part names a strategy of another support
stage (``silver.yaml`` ``strategy_stage``: exploration, comforting, action) than the strategy annotated at that
round, e.g. a question while the supporter comforts (the collapse of issue 26's GRPO arms onto one strategy at every
moment). A reply no rule marks is not a negative and is left out. Output ``policy_negatives.jsonl``: one
``policy_negative`` record per marked reply with its ``kind``, ``rule``, ``text`` and where it came from (``run`` =
the loop folder's name, ``policy``, ``prompt_id``, ``dialogue_id``, ``round_index``, ``split``) and
``conversation_free`` (no content word of its own conversation, the dialogue's situation included, and neither an
echo nor a misfit: usable beside any conversation); a misfit also keeps the ``strategy`` it names and the
``gold_strategy`` of its round. ``--kinds`` keeps only the records of some kinds. No conversation text is written.
"""

from __future__ import annotations

import argparse
import re
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from cer.reasoning import RESPONSE_PART, STRATEGY_PART, parse, reply_text
from cer.taxonomy import Taxonomy, load_taxonomy, named_strategy
from data_builder.negatives import END_PUNCT, POLICY_NEGATIVE, content_words, normalise, sentences, words
from data_builder.records import DIALOGUE, Record, base_dialogue_id, read_jsonl, read_records, write_jsonl
from data_builder.sample import rounds_of
from data_builder.silver_text import REPLY_POOLS, SilverConfig, load_config
from data_builder.stage import StageError, StageRun

KIND_OF_RULE: dict[str, str] = {
    "empty": "degenerate", "stage_label": "degenerate", "judge_wording": "degenerate", "repetition": "degenerate",
    "truncated": "degenerate", "dismissive": "dismissive", "echo": "echo", "short_no_content": "generic",
    "repeated_across_prompts": "generic", "stage_misfit": "misfit"}
#: the kind of a reply whose named strategy belongs to another support stage than the round's (``--stage-misfit``)
MISFIT = "misfit"
TEMPLATE_KINDS: tuple[str, ...] = ("generic", "dismissive")
#: the kinds of mark counted as degenerate replies (echo and dismissive replies are counted apart)
DEGENERATE_KINDS: tuple[str, ...] = ("degenerate", "generic")
RECORDS_FILE = "records.jsonl"
#: the file GRPO's ``log_completions_file`` writes in its output folder (``completions.rankR.jsonl`` for rank R > 0)
COMPLETIONS_FILE = "completions.jsonl"
#: the glob that finds every rank's completions file
COMPLETIONS_GLOB = COMPLETIONS_FILE.replace(".jsonl", "*.jsonl")
#: the ``policy`` of the replies read from GRPO completions files
GRPO_POLICY = "grpo"


def _literal_openings(phrasings: Iterable[str], min_words: int) -> set[str]:
    """The fixed text before the first ``{field}`` of each phrasing, in lower case, when it has enough words or is a
    label (ends with a colon)."""
    out = set()
    for p in phrasings:
        head = p.split("{", 1)[0].strip().lower()
        if len(head.split()) >= min_words or head.endswith(":"):
            out.add(head)
    return out


@dataclass
class Labeller:
    """Marks the replies that game the judge (module docstring); ``repeated``: texts (:func:`normalise`) written
    for at least ``min_repeat_prompts`` prompts, from :func:`repeated_texts`; ``stage_misfit``: whether the last
    rule (a named strategy of another support stage than the annotated one) applies."""

    cfg: SilverConfig
    taxonomy: Taxonomy
    repeated: set[str] = field(default_factory=set)
    stage_misfit: bool = False

    def __post_init__(self) -> None:
        rules = self.cfg.labeller
        stages = set(self.taxonomy.stages) | {v for t in self.cfg.templates.values() for v in t["stages"].values()}
        names = "|".join(sorted(map(re.escape, stages), key=len, reverse=True))
        nouns = "|".join(map(re.escape, rules.stage_nouns))
        self._stage = re.compile(rf"\b(?:{names})\W*(?:{nouns})\b|^\W*(?:{names})\W*$", re.IGNORECASE)
        steps = [p for t in self.cfg.templates.values() for k in ("analysis", "emotion", "strategy") for p in t[k]]
        self._openings = tuple(_literal_openings(steps, 2) | {m.lower() for m in rules.judge_markers if m.endswith(":")})
        self._markers = tuple(_literal_openings((p for ps in self.cfg.rationales.values() for p in ps), 3)
                              | {m.lower() for m in rules.judge_markers})
        self._dismissive = re.compile("|".join(rules.dismissive_patterns), re.IGNORECASE)
        self._templates = {normalise(t): kind for lang in self.cfg.negative_replies for kind in TEMPLATE_KINDS
                           for pool in REPLY_POOLS for t in self.cfg.hack_texts(lang, kind, pool)}

    def named_misfit(self, raw: str | None, gold_strategy: str | None) -> str | None:
        """The strategy a format-valid output ``raw`` names when it belongs to another support stage than
        ``gold_strategy`` (the round's annotation); None otherwise (no parse, no stage for either, same stage)."""
        parsed = parse(raw) if raw else None
        if parsed is None or not parsed.ok or not gold_strategy:
            return None
        named = named_strategy(parsed.parts[STRATEGY_PART] or "", self.taxonomy)
        gold = self.taxonomy.normalise(gold_strategy)
        stage, gold_stage = self.cfg.strategy_stage.get(named or ""), self.cfg.strategy_stage.get(gold or "")
        return named if stage and gold_stage and stage != gold_stage else None

    def label(self, text: str, history: list[dict[str, Any]], raw: str | None = None,
              format_ok: bool = True, gold_strategy: str | None = None) -> tuple[str, str] | None:
        """``(kind, rule)`` of a policy reply in its conversation, or None when no rule marks it; ``gold_strategy``:
        the strategy annotated at its round (the ``stage_misfit`` rule's reference)."""
        rules = self.cfg.labeller
        low, ws = text.lower().strip(), words(text)
        if not ws:
            return "degenerate", "empty"
        # first: a completion cut at the token limit is read from its tag-stripped text, whose analysis part would
        # otherwise be taken for a stage label or the judge's wording
        if (not format_ok and raw is not None and f"</{RESPONSE_PART}>" not in raw.lower()
                and len(ws) >= rules.min_truncated_words and not text.rstrip().endswith(tuple(END_PUNCT))):
            return "degenerate", "truncated"
        if self._stage.search(low):
            return "degenerate", "stage_label"
        if low.startswith(self._openings) or any(m in low for m in self._markers):
            return "degenerate", "judge_wording"
        said = Counter(normalise(s) for s in sentences(text) if len(words(s)) >= rules.min_repeat_sentence_words)
        if said and max(said.values()) >= 2:
            return "degenerate", "repetition"
        if self._dismissive.search(text):
            return "dismissive", "dismissive"
        seeker = [words(t["text"]) for t in history if t["role"] == "seeker"]
        run = max((_common_run(ws, s) for s in seeker), default=0)
        if run >= rules.min_echo_words and run >= rules.echo_share * len(ws):
            return "echo", "echo"
        if (kind := self._templates.get(normalise(text))) is not None:
            return kind, "template"
        said_there = set().union(*(content_words(t["text"], rules.stopwords) for t in history))
        if "?" not in text and len(ws) <= rules.max_short_words and not content_words(text, rules.stopwords) & said_there:
            return "generic", "short_no_content"
        if normalise(text) in self.repeated:
            return "generic", "repeated_across_prompts"
        if self.stage_misfit and format_ok and self.named_misfit(raw, gold_strategy):
            return MISFIT, "stage_misfit"
        return None


@lru_cache(maxsize=1)
def default_labeller() -> Labeller:
    """The :class:`Labeller` of the shipped ``silver.yaml`` and taxonomy (no cross-prompt repeats), built once."""
    return Labeller(load_config(), load_taxonomy(None))


def mark_reply(text: str, history: list[dict[str, Any]], raw: str | None = None,
               format_ok: bool = True) -> str | None:
    """``kind/rule`` of the rule that marks a policy reply in its conversation (``degenerate/stage_label``, ...),
    None when no rule does (:func:`default_labeller`)."""
    marked = default_labeller().label(text, history, raw, format_ok)
    return None if marked is None else f"{marked[0]}/{marked[1]}"


def is_degenerate(mark: str | None) -> bool:
    """Whether a :func:`mark_reply` mark is of a degenerate kind (:data:`DEGENERATE_KINDS`)."""
    return mark is not None and mark.split("/", 1)[0] in DEGENERATE_KINDS


def _common_run(a: list[str], b: list[str]) -> int:
    """Length of the longest run of words found in both ``a`` and ``b``."""
    best, prev = 0, [0] * (len(b) + 1)
    for x in a:
        cur = [0] * (len(b) + 1)
        for j, y in enumerate(b, 1):
            if x == y:
                cur[j] = prev[j - 1] + 1
                best = max(best, cur[j])
        prev = cur
    return best


def repeated_texts(replies: Iterable[tuple[str, str]], min_prompts: int) -> set[str]:
    """Texts (:func:`normalise`) written for at least ``min_prompts`` distinct prompts; ``replies``: (prompt id,
    text) pairs."""
    prompts: dict[str, set[str]] = defaultdict(set)
    for prompt, text in replies:
        prompts[normalise(text)].add(prompt)
    return {t for t, p in prompts.items() if len(p) >= min_prompts}


@dataclass(frozen=True)
class PolicyReply:
    """One reply a policy wrote on one prompt, with where it came from."""

    run: str
    policy: str
    file: Path
    record: Record


def _completion_record(line: Record) -> Record | None:
    """A GRPO completions line as a reply record (``id``, ``text`` = its reply, ``raw``, ``format_ok``; no
    ``history``), None when it lacks the prompt's round or text."""
    raw, round_index = line.get("text"), line.get("round_index")
    if not isinstance(raw, str) or not isinstance(round_index, int) or line.get("dialogue_id") is None:
        return None
    reply, parsed = reply_text(raw)
    return {"id": f"{line['dialogue_id']}#r{round_index}", "text": reply, "raw": raw, "format_ok": parsed.ok}


def read_loop_replies(folders: list[Path], counts: Counter[str] | None = None) -> list[PolicyReply]:
    """Every reply below the folders: loop ``records.jsonl`` files (policy = the file's folder name) and GRPO
    completions files (policy :data:`GRPO_POLICY`); ``counts`` gets the completions lines skipped."""
    out: list[PolicyReply] = []
    for folder in folders:
        records, completions = sorted(folder.rglob(RECORDS_FILE)), sorted(folder.rglob(COMPLETIONS_GLOB))
        if not records and not completions:
            raise StageError(f"{folder}: no {RECORDS_FILE} or {COMPLETIONS_FILE} below it (not a compeer-loop or "
                             "GRPO output folder?)")
        for f in records:
            out.extend(PolicyReply(folder.name, f.parent.name, f, rec) for rec in read_jsonl(f)
                       if isinstance(rec.get("text"), str) and "id" in rec)
        for f in completions:
            for line in read_jsonl(f):
                if (rec := _completion_record(line)) is not None:
                    out.append(PolicyReply(folder.name, GRPO_POLICY, f, rec))
                elif counts is not None:
                    counts["skipped_completion_without_round"] += 1
    return out


def round_index_of(history: list[dict[str, Any]]) -> int:
    """The 1-based round index (as :func:`data_builder.sample.make_round` numbers it) of the supporter turn that
    follows ``history`` (the turns before it, ending with a seeker turn): one more than the rounds started in it.
    GRPO's completions file keys each completion's prompt by it; :func:`history_before` is its inverse."""
    return len(rounds_of(history)) + 1


def history_before(turns: list[dict[str, Any]], round_index: int) -> list[dict[str, Any]] | None:
    """The ``{role, text}`` turns of a dialogue before its 1-based round ``round_index``
    (:func:`data_builder.sample.make_round`'s history), None when it has no such round."""
    starts = rounds_of(turns)
    if not 1 <= round_index <= len(starts):
        return None
    return [{"role": t["role"], "text": t["text"]} for t in turns[:starts[round_index - 1]]]


def strategy_at(turns: list[dict[str, Any]], round_index: int) -> str | None:
    """The strategy annotated on the supporter turn that opens 1-based round ``round_index``, None without one."""
    starts = rounds_of(turns)
    return turns[starts[round_index - 1]].get("strategy") if 1 <= round_index <= len(starts) else None


def label_replies(replies: list[PolicyReply], split_of: dict[str, str], situations: dict[str, str],
                  cfg: SilverConfig, taxonomy: Taxonomy, turns_of: dict[str, list[dict[str, Any]]] | None = None,
                  counts: Counter[str] | None = None, stage_misfit: bool = False,
                  kinds: frozenset[str] | None = None) -> tuple[list[Record], Counter[str]]:
    """The ``policy_negative`` records of the replies some rule marks (of ``kinds`` only, when given); returns them
    and counts. A reply without ``history`` gets the turns of its dialogue (``turns_of``, by dialogue id) before its
    round; one without ``gold_strategy`` (GRPO completions) the strategy annotated at its round there."""
    counts = Counter() if counts is None else counts
    labeller = Labeller(cfg, taxonomy, repeated_texts(((p.record["id"], p.record["text"]) for p in replies),
                                                      cfg.labeller.min_repeat_prompts), stage_misfit)
    out: list[Record] = []
    for p in replies:
        rec = p.record
        dialogue_id, _, round_index = str(rec["id"]).rpartition("#r")
        counts[f"read_{p.run}_{p.policy}"] += 1
        split = split_of.get(base_dialogue_id(dialogue_id))
        if split is None or not round_index.isdigit():
            counts["skipped_unknown_dialogue"] += 1
            continue
        history = rec.get("history")
        if history is None:
            history = history_before((turns_of or {}).get(dialogue_id, []), int(round_index))
            if history is None:
                counts["skipped_unknown_round"] += 1
                continue
        gold = rec.get("gold_strategy") or strategy_at((turns_of or {}).get(dialogue_id, []), int(round_index))
        marked = labeller.label(rec["text"], history, rec.get("raw"), bool(rec.get("format_ok", True)), gold)
        if marked is None or (kinds is not None and marked[0] not in kinds):
            counts[f"not_marked_{split}" if marked is None else f"left_out_{marked[0]}"] += 1
            continue
        kind, rule = marked
        said = " ".join([t["text"] for t in history] + [situations.get(dialogue_id, "")])
        free = kind not in ("echo", MISFIT) and not (content_words(rec["text"], cfg.labeller.stopwords)
                                                    & content_words(said, cfg.labeller.stopwords))
        named = ({"strategy": labeller.named_misfit(rec.get("raw"), gold), "gold_strategy": gold}
                 if kind == MISFIT else {})
        counts[f"kind_{kind}"] += 1
        counts[f"rule_{rule}"] += 1
        counts[f"split_{split}"] += 1
        counts["conversation_free"] += free
        out.append({"record": POLICY_NEGATIVE, "kind": kind, "rule": rule, "text": rec["text"], "run": p.run,
                    "policy": p.policy, "prompt_id": rec["id"], "dialogue_id": dialogue_id,
                    "round_index": int(round_index), "split": split, "conversation_free": free,
                    "format_ok": bool(rec.get("format_ok", True)), **named})
    counts["negatives"] = len(out)
    counts["distinct_texts"] = len({normalise(r["text"]) for r in out})
    return out, counts


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``compeer-data policy-negatives``."""
    p = sub.add_parser("policy-negatives", help="mark the replies GRPO policies wrote to game the judge",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--from", dest="folders", action="append", required=True, type=Path, metavar="DIR",
                   help="a compeer-loop folder or a GRPO output folder with completions.jsonl (repeatable; its "
                        "name is the records' `run`)")
    p.add_argument("--dialogues", action="append", required=True, metavar="SPLIT=FILE",
                   help="ingest output of a split, e.g. valid=ingest-valid/dialogues.jsonl (repeatable)")
    p.add_argument("--out", required=True, type=Path, help="output folder (created); gets manifest.json")
    p.add_argument("--taxonomy", default=None, help="strategy taxonomy YAML")
    p.add_argument("--config", default=None, help="silver construction YAML (default: packaged silver.yaml)")
    p.add_argument("--stage-misfit", action="store_true",
                   help="also mark, last, a reply whose named strategy is of another support stage than the one "
                        "annotated at its round (kind misfit)")
    p.add_argument("--kinds", nargs="+", default=None, metavar="KIND",
                   help="keep only the records of these kinds (e.g. misfit); default: every kind")
    p.add_argument("--quiet", action="store_true", help="do not print the summary table")
    p.set_defaults(run=run)


def run(args: argparse.Namespace, argv: list[str] | None = None, **_: Any) -> int:
    """Execute the policy-negatives stage."""
    split_files: dict[str, str] = {}
    for spec in args.dialogues:
        split, sep, path = spec.partition("=")
        if not sep or not split or not path:
            raise StageError(f"--dialogues {spec!r}: expected SPLIT=FILE")
        split_files[path] = split
    counts: Counter[str] = Counter()
    replies = read_loop_replies(list(args.folders), counts)
    st = StageRun("policy-negatives", args.out, argv, sorted({str(r.file) for r in replies}) + list(split_files),
                  params={"from": [str(f) for f in args.folders], "dialogues": args.dialogues,
                          "stage_misfit": args.stage_misfit, "kinds": args.kinds})
    split_of: dict[str, str] = {}
    situations: dict[str, str] = {}
    turns_of: dict[str, list[dict[str, Any]]] = {}
    for path, split in split_files.items():
        for d in read_records([Path(path)], (DIALOGUE,)):
            split_of[base_dialogue_id(d["id"])] = split
            situations[d["id"]] = str((d.get("meta") or {}).get("situation") or "")
            turns_of[d["id"]] = d["turns"]
    records, counts = label_replies(replies, split_of, situations, load_config(args.config),
                                    load_taxonomy(args.taxonomy), turns_of, counts, args.stage_misfit,
                                    frozenset(args.kinds) if args.kinds else None)
    write_jsonl(st.path("policy_negatives.jsonl"), records)
    st.counts = {k: counts[k] for k in sorted(counts)}
    st.finish(quiet=args.quiet)
    return 0
