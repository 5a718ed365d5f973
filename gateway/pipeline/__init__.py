"""The request path as named steps, which `gateway.proxy.Proxy` runs in order:

admit (`admit.py`: API key -> tenant, the body read once into a `PreparedRequest`, tenant
limits) -> route (`route.py`: pure, a snapshot of endpoints in, one endpoint out) -> dispatch
(`dispatch.py`: attempts and retries, each relayed by `gateway.relay`) -> record
(`record.py`: the `Flight` finished into a `RequestRecord` for the sinks). A `Flight`
(`flight.py`) carries one request's timeline and outcome through all of them.
"""
