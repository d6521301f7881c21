"""Models and data: loading them by reference, and the built-in ones made on this machine (the tiny and small
language models, their corpora, the sentence encoder's loader)."""
