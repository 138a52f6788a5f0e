"""Training data: Megatron indexed datasets, preprocessing, SFT."""
