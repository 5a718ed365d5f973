"""HTTP/1.1 on the bottom floor: one request-head parser (`wire.request_head`), one request
encoder (`wire.request`), one response parser (`wire.response`), one response encoder
(`wire.response_encoder`), one pooled keep-alive client (`wire.client`, over `wire.connection`
and `wire.pool`), and the Protocols a relay joins (`wire.exchange`). httptools (llhttp)
parses responses underneath. The gateway and the load generator use it; it imports nothing
of wattgate's.
"""
