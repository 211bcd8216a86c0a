"""`make test` runs pytest-xdist workers (`-n 2 --dist loadfile`): the scheduler of tests/conftest.py keeps each
module on one worker and the modules sharing a session-wide process (the vLLM reward server, the Docker images)
together, so that process starts once."""

from __future__ import annotations

from typing import Any

import pytest

from tests.conftest import SHARED_PROCESS_MODULES, pytest_xdist_make_scheduler


class _Config:
    """The options xdist's schedulers read, as ``pytest -n 2 --dist DIST`` sets them."""

    def __init__(self, dist: str) -> None:
        self.values: dict[str, Any] = {"dist": dist, "tx": ["2*popen"]}  # what -n 2 expands to

    def getvalue(self, name: str) -> Any:
        return self.values[name]


def test_modules_sharing_a_process_are_one_work_unit_and_others_one_per_module() -> None:
    pytest.importorskip("xdist")
    config: Any = _Config("loadfile")
    scheduler: Any = pytest_xdist_make_scheduler(config, None)
    server = SHARED_PROCESS_MODULES["reward_server"]
    assert len(server) >= 2
    units = {scheduler._split_scope(f"{module}::test_x") for module in server}
    assert units == {"reward_server"}
    assert scheduler._split_scope("tests/unit/test_cer.py::test_a") == scheduler._split_scope(
        "tests/unit/test_cer.py::test_b") == "tests/unit/test_cer.py"
    assert scheduler._split_scope("tests/unit/test_cache_key.py::test_a") != "tests/unit/test_cer.py"
    other: Any = _Config("load")
    assert pytest_xdist_make_scheduler(other, None) is None  # other modes: xdist's own scheduler


def test_every_listed_module_uses_its_shared_process_fixture(request: pytest.FixtureRequest) -> None:
    """The other half of the collection check (which fails a test using the fixture from an unlisted module), on the
    real test modules: a listed module still uses its fixture."""
    import ast
    from pathlib import Path

    root = Path(request.config.rootpath)
    for fixture, modules in SHARED_PROCESS_MODULES.items():
        for module in modules:
            tree = ast.parse((root / module).read_text())
            functions = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
            args = {a.arg for function in functions for a in function.args.args}
            assert fixture in args, f"{module} no longer uses `{fixture}`: drop it from SHARED_PROCESS_MODULES"
