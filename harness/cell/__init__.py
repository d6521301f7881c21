"""One cell from settings to stored runs: what is checked before any model loads, the stage graph (train, attack,
generate, score), the detectors and the oracle on stored texts, and the metrics each run stores (which
``harness.report`` reads)."""
