"""The wattgate proxy: HTTP API, routing, streaming relay, timing, SLOs, tenants."""
