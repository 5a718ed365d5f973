"""Load generation: arrivals, workloads, traces, client, runner, metrics, reports."""
