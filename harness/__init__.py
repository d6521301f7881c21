"""The harness: train weight-learned watermarks, modify the models as users do, and measure what survives."""

__version__ = "0.1.0"
