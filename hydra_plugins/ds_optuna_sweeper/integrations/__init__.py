"""Glue between a composed Hydra config and training libraries (transformers, DeepSpeed, accelerate)."""
