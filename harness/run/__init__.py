"""From settings to stored runs: the stage graph of one cell (train, attack, generate, score), grids of cells and
the executors that run them."""
