"""Graph passes. Each takes a model and returns a new one with its statistics; none mutates its input."""
