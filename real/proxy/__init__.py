"""The black-box proxy: the only way a harness reaches a model (docs/scheduler.md#role-transitions,
docs/trajectories.md#proxy-and-tito).

- ``app`` / ``admin`` / ``cli`` / ``config``: the aiohttp server, its admin API
  (execution keys, routes, drains), ``gyre proxy --config FILE``;
  ``collector``: the process's garbage collector, tuned for a server;
- ``request`` / ``fields``: the typed request every body is parsed into before
  any response starts, the proxy's errors, the JSON field readers and the
  always-encodable JSON writer (standard library only: ``tests/proxy_parse``);
- ``api/``: one module per wire format (``anthropic``, ``openai_chat``,
  ``openai_responses``): parsing requests and writing responses and streams;
- ``model_call``: the API-independent core of one call (prompt, generation,
  parsing, record); ``tokenize``: messages to token ids through the served
  model's template; ``toolcalls``: the model's tool-call output format;
- ``generation`` / ``engine_client`` / ``routing``: one call's generation kept
  alive across reroutes and engine failures, the SGLang client, the routing
  table; ``http_client``: the lean keep-alive HTTP/1.1 client under it;
- ``recording``: per-execution state, TITO records into ``gyre.real.store``.

May import: ``gyre`` (trajectory records, trees, tool-call cache) and
``gyre.real.store``. Never the runtime, the training cells or the engines'
manager: the proxy talks to engines over HTTP only.
"""
