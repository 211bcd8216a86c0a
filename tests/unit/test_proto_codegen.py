"""proto/generate.py: the generated modules live under ``compeer_proto`` (a top-level name no project package can
take) while the wire contract stays ``compeer.reward.v1`` (package, service name, the descriptor's file name)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from reward_server.proto import pb, pb_grpc

ROOT = Path(__file__).resolve().parents[2]


def test_the_wire_names_are_unchanged() -> None:
    assert pb.__name__ == "compeer_proto.reward.v1.reward_pb2"
    assert pb_grpc.__name__ == "compeer_proto.reward.v1.reward_pb2_grpc"
    assert pb.DESCRIPTOR.package == "compeer.reward.v1"
    assert pb.DESCRIPTOR.name == "compeer/reward/v1/reward.proto"  # what server reflection serves
    service = pb.DESCRIPTOR.services_by_name["RewardService"]
    assert service.full_name == "compeer.reward.v1.RewardService"
    assert pb.ScoreGroupRequest.DESCRIPTOR.full_name == "compeer.reward.v1.ScoreGroupRequest"


def test_generate_writes_a_relocatable_package(tmp_path: Path) -> None:
    """A fresh generation into another folder: the gRPC module imports its messages relatively, and the package
    imports from there alone (a child process: one descriptor pool per process)."""
    done = subprocess.run([sys.executable, str(ROOT / "proto" / "generate.py"), "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    v1 = tmp_path / "compeer_proto" / "reward" / "v1"
    assert sorted(p.name for p in v1.iterdir()) == ["__init__.py", "reward_pb2.py", "reward_pb2.pyi",
                                                    "reward_pb2_grpc.py"]
    grpc_module = (v1 / "reward_pb2_grpc.py").read_text()
    assert "from . import reward_pb2 as " in grpc_module and "from compeer.reward" not in grpc_module
    probe = ("import compeer_proto.reward.v1.reward_pb2_grpc as g, compeer_proto.reward.v1.reward_pb2 as pb;"
             f"assert g.__file__.startswith({str(tmp_path)!r});"
             "print(pb.DESCRIPTOR.services_by_name['RewardService'].full_name)")
    out = subprocess.run([sys.executable, "-P", "-c", probe], capture_output=True, text=True, timeout=60,
                         check=False, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(tmp_path)})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "compeer.reward.v1.RewardService"
