"""reward_server: UnifiReward served over gRPC and HTTP, one transport-neutral core behind both fronts."""

__version__ = "0.1.0"
