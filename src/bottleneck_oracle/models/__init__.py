"""The learned models (HeteroGAT variants) and their baselines; the shipped pretrained checkpoint."""
