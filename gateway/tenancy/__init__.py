"""Tenant controls: rate limits, concurrency caps and budgets (USD, J, gCO2e) per tenant."""
