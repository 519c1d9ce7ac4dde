"""Wire formats of the proxy: one module per API a harness speaks.

Each module parses a request body into a ``model_call.ChatRequest`` and writes
the API's own responses, stream events and error shapes. May import the
proxy's ``model_call``, ``generation`` and ``toolcalls`` only.
"""
