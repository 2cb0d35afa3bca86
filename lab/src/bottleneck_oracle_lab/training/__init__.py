"""Datasets of labelled graphs built from generated runs."""
