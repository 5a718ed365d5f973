"""The request path as named steps, which `gateway.proxy.Proxy` runs in order, each by a
method named for what it does:

admit (`admit.py`, `Admit.admit`: API key -> tenant, the body read once into a
`PreparedRequest`, tenant limits) -> route (`route.py`, `Router.choose`: pure, a snapshot of
endpoints in, one endpoint out; asked by dispatch for each attempt) -> dispatch
(`dispatch.py`, `Dispatch.send`: attempts and retries, each relayed by
`gateway.relay.Relay.forward`) -> record (`record.py`, `RecordPublisher.publish`: the
`Flight` finished into a `RequestRecord` for the sinks). A `Flight` (`flight.py`) carries one
request's timeline and outcome through all of them.
"""
