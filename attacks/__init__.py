"""Attacks: what users do to an open watermarked model (model -> model) or to its text (texts -> texts)."""
