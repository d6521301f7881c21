"""From settings to stored runs: the stage graph of one cell (train, attack, generate, score), the metrics each run
stores (which ``harness.report`` reads), grids of cells and the executors that run them."""
