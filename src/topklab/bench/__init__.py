"""Solvers and measurement helpers for the timing experiments (STk paper Table 1, scaling bench)."""
