"""gRPC front: converters (``convert``), the servicer (``servicer``) and the async client lives in ``reward_server.client``."""
