"""Ahead-of-time compilation for a target topology (a TPU slice compiled from any host): programs, costs, memory."""
