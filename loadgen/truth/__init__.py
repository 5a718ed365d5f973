"""Accounting against the simulator's truth: a simulated fleet behind the real gateway, every
request's bill joined to the energy the simulated engine says it caused (bench.accounting_truth,
tests/integration/test_fairness_strategies.py)."""
