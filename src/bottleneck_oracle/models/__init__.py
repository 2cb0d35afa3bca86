"""The learned models at inference, in numpy (no torch): the graph network (Predictor) and the per-node corrections; the shipped pretrained.npz and corrections.npz."""
