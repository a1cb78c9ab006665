"""Simulated hardware for tests: GPUs (cupy and its NCCL module) on the CPU."""
