"""Wire formats of the proxy: one module per API a harness speaks.

Each module parses a request body into a ``request.ChatRequest`` (every field
checked, before any response starts) and writes the API's own responses,
stream events (ending with the API's in-stream error event on any failure)
and error shapes. May import the proxy's ``request``, ``fields`` and
``toolcalls`` only (all pure: no aiohttp, no tokenizer).
"""
