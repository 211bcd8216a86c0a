"""HTTP front (FastAPI): JSON mirror of the RPCs plus health, readiness and metrics."""
