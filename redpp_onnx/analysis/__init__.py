"""Analyses of a model: pure functions, they never change the graph."""
