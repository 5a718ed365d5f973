"""The gateway's HTTP handlers, one module per thing they serve, and its middlewares.

The completion routes (`completions.py`) hand the request to the proxy; the others serve the
gateway's own state: health and readiness (`health.py`), the model list (`model_list.py`),
the Prometheus scrape (`scrape.py`), a tenant's own usage (`usage.py`) and the admin API
(`admin.py`). `middlewares.py` shapes every answer (OpenAI-style JSON errors, the front's
refusals, the `Server` header). gateway/app.py puts them on the routes.
"""
