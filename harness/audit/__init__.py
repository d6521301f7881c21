"""Whether a model or texts carry a key: ``harness detect``'s request and verdict, and the attribution stage a grid
cell adds for each derivative, each calibrated to the false-positive rate it states."""
