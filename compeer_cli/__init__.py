"""Console-script dispatchers that span several packages (``compeer-train judge|judge-eval|grpo``)."""
