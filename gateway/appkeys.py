"""The aiohttp application's shared state: one `web.AppKey` per object that `build_app`
(gateway/app.py) puts on the app and the handlers and the front read back."""

from __future__ import annotations

from aiohttp import web

from accounting.service import AccountingService
from accounting.supervisor import ApportionerChild
from gateway.config import GatewayConfig
from gateway.front.connections import FrontConnections
from gateway.proxy import Proxy
from gateway.routing.learner import RoutingModels
from gateway.serving_metrics import GatewayMetrics
from gateway.tenancy.controls import TenantControls
from gateway.upstreams import Upstreams

CONFIG = web.AppKey("config", GatewayConfig)
METRICS = web.AppKey("metrics", GatewayMetrics)
UPSTREAMS = web.AppKey("upstreams", Upstreams)
PROXY = web.AppKey("proxy", Proxy)  # set by the app's lifecycle context, once it starts
ACCOUNTING = web.AppKey("accounting", AccountingService)  # only with accounting on
APPORTIONER = web.AppKey("apportioner", ApportionerChild)  # only under `wattgate serve`
CONNECTIONS = web.AppKey("connections", FrontConnections)
ROUTING_MODELS = web.AppKey("routing_models", RoutingModels)
CONTROLS = web.AppKey("controls", TenantControls)
