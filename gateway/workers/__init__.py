"""`wattgate serve --workers N`: a node's worker processes on one port, their parent, and
how their metrics and rate limits are one node's."""
