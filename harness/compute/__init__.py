"""Where the arithmetic happens: the training loop, sampling and perplexity, several processes, progress."""
