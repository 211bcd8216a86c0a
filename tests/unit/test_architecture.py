"""The dependency direction of the packages (README, "Architecture"), checked on every import statement, lazy
imports inside functions included, so that it cannot regress:

    cer  <-  judge  <-  reward_server, reward_trainer, data_builder
    policy_trainer -> cer, the service's client and wire types (reward_server.client, reward_server.types), the
                      model store (judge.model_store) for the default policy weights, the training guard
                      (judge.guards) and the degenerate-reply rule (data_builder.policy_negatives)

and that each shared rule (the CER tag regex and tag stripping, the step-3 strategy rule, strategy accuracy, the dtype
rule, the cache keys) is defined in one module only (:data:`HOMES`): a copy elsewhere fails the test.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FIRST_PARTY = ("cer", "judge", "reward_server", "reward_trainer", "data_builder", "policy_trainer", "evaluator",
               "compeer_loop", "compeer_cli", "compeer_proto", "compeer", "bench", "tests")

#: package -> the first-party modules (or module prefixes) it may import besides itself.
ALLOWED: dict[str, tuple[str, ...]] = {
    "cer": (),
    "judge": ("cer",),
    "reward_server": ("cer", "judge", "compeer_proto.reward.v1"),
    "data_builder": ("cer", "judge"),
    # the D/R/P ablation builds its training sets with the emit stage's functions; the reward AUC orders its kinds of
    # negative as the contrast stage lists them; the evaluation's cue table reads replies as data_builder.cues does
    "reward_trainer": ("cer", "judge", "data_builder.contrast", "data_builder.cues", "data_builder.emit",
                       "data_builder.records"),
    "policy_trainer": ("cer", "reward_server.client", "reward_server.types", "judge.model_store", "judge.guards",
                       "judge.profiles", "judge.settings", "data_builder.policy_negatives"),
    # the simulator, scorer and model under test share the dataset pipeline's cached generate -> validate -> retry
    # wrapper (on judge.generation)
    "evaluator": ("cer", "judge", "data_builder.llm"),
    # the end-to-end loop composes the others: prompt sets from the pipeline's stages, the warm-up from the policy
    # trainer, the evaluator's held-out-turn harness and metrics, the trained judge over the service's client; the
    # reply cues (a question, a short reply) it reads in policies' replies as data_builder.cues reads them in judge items
    "compeer_loop": ("cer", "judge.model_store", "judge.device", "judge.settings", "data_builder.emit", "data_builder.ingest", "data_builder.records",
                     "data_builder.sample", "data_builder.silver", "data_builder.silver_text", "data_builder.policy_negatives", "data_builder.cues", "policy_trainer.config",
                     "policy_trainer.runner", "policy_trainer.warmup", "evaluator", "reward_server.client",
                     "reward_server.types"),
}


def _imports(path: Path) -> list[tuple[int, str]]:
    """``(line, module)`` of every absolute import in a source file."""
    out: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            # ``from judge import conversation`` imports the module judge.conversation; ``from judge.protocol import
            # JudgeSettings`` imports from judge.protocol
            for a in node.names:
                sub = f"{node.module}.{a.name}"
                out.append((node.lineno, sub if _is_module(sub) else node.module))
    return out


def _is_module(dotted: str) -> bool:
    base = ROOT.joinpath(*dotted.split("."))
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def _allowed(module: str, allowed: tuple[str, ...]) -> bool:
    return any(module == a or module.startswith(a + ".") for a in allowed)


def _violations(package: str) -> list[str]:
    bad = []
    for path in sorted((ROOT / package).rglob("*.py")):
        for line, module in _imports(path):
            if module.split(".")[0] in FIRST_PARTY and not _allowed(module, (package, *ALLOWED[package])):
                bad.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
    return bad


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_imports_follow_the_dependency_direction(package: str) -> None:
    assert (ROOT / package).is_dir()
    assert _violations(package) == []


def test_the_check_sees_lazy_imports_and_submodules(tmp_path: Path) -> None:
    """The checker itself: an import inside a function counts, and a forbidden one is reported."""
    src = tmp_path / "m.py"
    src.write_text("def f():\n    from reward_server.core import RewardCore\n    import judge.engines.base\n"
                   "from judge import conversation\n")
    assert sorted(m for _, m in _imports(src)) == ["judge.conversation", "judge.engines.base", "reward_server.core"]
    assert not _allowed("reward_server.core", ALLOWED["policy_trainer"])
    assert _allowed("reward_server.client", ALLOWED["policy_trainer"])
    assert not _allowed("reward_server", ALLOWED["judge"])


def test_offline_packages_reach_the_service_only_through_its_client_and_wire_types() -> None:
    """The issue's check: ``git grep "from reward_server" -- data_builder reward_trainer policy_trainer`` shows only
    the client and the wire types."""
    for package in ("data_builder", "reward_trainer", "policy_trainer"):
        for path in (ROOT / package).rglob("*.py"):
            for _, module in _imports(path):
                if module.split(".")[0] == "reward_server":
                    assert _allowed(module, ("reward_server.client", "reward_server.types")), (path, module)


def test_no_module_is_a_god_file() -> None:
    """Modules stay under ~400 lines (a subsystem that grows becomes a subpackage split by concern)."""
    long = {}
    for package in (*ALLOWED, "compeer_cli"):
        for path in (ROOT / package).rglob("*.py"):
            n = len(path.read_text(encoding="utf-8").splitlines())
            if n > 400:
                long[str(path.relative_to(ROOT))] = n
    assert long == {}


#: rules defined once: function name -> the one module that may define it (README, "Architecture").
HOMES: dict[str, str] = {
    "strip_tags": "cer/reasoning.py", "named_strategy": "cer/taxonomy.py", "strategy_accuracy": "cer/taxonomy.py",
    "resolve_device": "judge/device.py", "resolve_device_dtype": "judge/device.py", "dtype_name": "judge/device.py",
    "content_key": "judge/generation.py", "attempt_key": "judge/generation.py", "judgment_key": "judge/conversation.py",
    "cache_key": "reward_server/cache.py", "parse_verdicts": "cer/verdicts.py",
    "kappa": "cer/agreement.py", "label_matrix": "cer/agreement.py",
}
#: the one module that compiles the CER tag regex
TAG_HOME = "cer/reasoning.py"
_PART_TAG = re.compile(r"<[/?()]*(?:\?:)?(?:analysis|emotion|strategy|response)\b|\bPARTS\b")
_DTYPES = {"bfloat16", "float16", "float32", "half", "float"}


def _sources() -> list[Path]:
    return sorted(p for package in (*ALLOWED, "compeer_cli") for p in (ROOT / package).rglob("*.py"))


def _is_dtype(node: ast.expr) -> bool:
    """A dtype named as a string (``"bfloat16"``) or as torch's attribute (``torch.float32``)."""
    if isinstance(node, ast.Constant):
        return node.value in _DTYPES
    return isinstance(node, ast.Attribute) and node.attr in _DTYPES


def _redefinitions(path: Path, rel: str) -> list[str]:
    """Where ``path`` re-defines a rule that has a home elsewhere: a function (or module-level name) of
    :data:`HOMES`, a compiled (or ``re.*``-applied) CER tag pattern, or a device -> dtype choice."""
    text = path.read_text(encoding="utf-8")
    bad = []
    for node in ast.walk(ast.parse(text, str(path))):
        names = []
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names = [node.name]
        elif isinstance(node, ast.Assign):
            names = [t.id for t in node.targets if isinstance(t, ast.Name)]
        bad += [f"{rel}:{node.lineno} defines {n} (home: {HOMES[n]})" for n in names if HOMES.get(n, rel) != rel]
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and isinstance(node.func.value, ast.Name)
                and node.func.value.id == "re" and node.args and rel != TAG_HOME
                and _PART_TAG.search(ast.get_source_segment(text, node.args[0]) or "")):
            bad.append(f"{rel}:{node.lineno} makes a CER tag pattern (home: {TAG_HOME}, cer.reasoning.TAG)")
        if (isinstance(node, ast.IfExp) and _is_dtype(node.body) and _is_dtype(node.orelse)
                and rel != HOMES["resolve_device_dtype"]):
            bad.append(f"{rel}:{node.lineno} picks a dtype itself (home: judge.device.resolve_device_dtype)")
    return bad


def test_each_shared_rule_is_defined_once() -> None:
    """Nothing defines a tag, a label or a rule twice (DESIGN.md): the strategy rule, strategy accuracy, the tag
    regex and tag stripping, the dtype rule and the cache keys each live in one module and are imported elsewhere."""
    bad = [b for path in _sources() for b in _redefinitions(path, str(path.relative_to(ROOT)))]
    assert bad == []
    for name, home in HOMES.items():
        assert f"def {name}(" in (ROOT / home).read_text(encoding="utf-8"), (name, home)


def test_the_rule_check_sees_copies(tmp_path: Path) -> None:
    """The checker itself: a second strip_tags, a tag regex built from PARTS or spelled out, a dtype picked inline."""
    src = tmp_path / "m.py"
    src.write_text("import re\nfrom cer.reasoning import PARTS\n"
                   "_TAGS = re.compile(rf\"</?(?:{'|'.join(PARTS)})>\", re.IGNORECASE)\n"
                   "X = re.sub(r\"</?response>\", \"\", \"t\")\n"
                   "def strip_tags(text):\n    return text\n"
                   "def dtype(device):\n    return 'bfloat16' if device == 'cuda' else 'float32'\n"
                   "strategy_accuracy = len\n")
    found = _redefinitions(src, "evaluator/m.py")
    assert len(found) == 5, found
    assert _redefinitions(src, "cer/reasoning.py") != found  # the tag regex's home may compile it


def test_the_readme_architecture_section_is_this_table() -> None:
    """README.md's "Architecture" block lists, per package, exactly the edges this test allows."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    block = text.split("## Architecture\n```\n", 1)[1].split("```", 1)[0]
    documented: dict[str, set[str]] = {}
    for line in block.splitlines():
        name, _, deps = line.partition("->")
        name = name.split()[0]
        deps = re.sub(r"\([^)]*\)", "", deps)  # comments in parentheses
        documented[name] = {d.strip() for d in re.split(r"[,+]", deps) if d.strip()}
    assert documented == {package: set(allowed) - {"compeer_proto.reward.v1"} for package, allowed in ALLOWED.items()}
