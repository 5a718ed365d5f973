"""The completion routes (`/v1/chat/completions`, `/v1/completions`, `/v1/embeddings`) on
connections the front handed to aiohttp: the proxy serves them (gateway/proxy.py)."""

from __future__ import annotations

from aiohttp import web

from gateway.appkeys import PROXY


async def completions(request: web.Request) -> web.StreamResponse:
    return await request.app[PROXY].handle(request)
