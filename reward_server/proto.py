"""Import point of the generated protobuf modules (``make proto`` -> ``proto/generate.py`` writes them into the
git-ignored ``compeer_proto/``; the proto package, and so the service's name on the wire, is ``compeer.reward.v1``)."""

from __future__ import annotations

try:
    from compeer_proto.reward.v1 import reward_pb2 as pb
    from compeer_proto.reward.v1 import reward_pb2_grpc as pb_grpc
except ImportError as exc:  # pragma: no cover - only without the generated code
    raise ImportError("generated gRPC code not found: run `make proto` (writes compeer_proto/reward/v1/*_pb2*.py)"
                      ) from exc

__all__ = ["pb", "pb_grpc"]
