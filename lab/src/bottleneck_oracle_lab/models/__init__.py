"""The learned models as trained: the HeteroGAT variants (PyG), the baselines, checkpoints."""
