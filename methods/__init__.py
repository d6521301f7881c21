"""Watermark methods: each trains a watermarked student from a base model and owns the detector for it."""
