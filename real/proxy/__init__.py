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
  ``engine_stream``: the engine's event stream decoded into new tokens, in work
  linear in the tokens also when the engine repeats every token in every chunk;
- ``recording``: per-execution state, TITO records into ``gyre.real.store``.

Hand-written pieces, and what each buys over what it stands in for, measured with
``python -m bench handwritten`` (2026-12-05, 2 shared cores: CPU time is the figure that holds;
medians of 3 runs, the load average beside each):

- ``http_client`` instead of aiohttp's client: 0.090 ms of client CPU per streamed engine
  call at 64 concurrent calls (runs 0.084-0.090) against aiohttp's 0.142 ms (0.135-0.143),
  load 8-10: 0.05 ms less per call, about 8% of the proxy's 0.57-0.60 ms per call at 64 clients
  (``bench proxy``). Its connections are ``asyncio.BufferedProtocol``s: the event loop reads into
  one receive buffer per connection, the chunked coding is decoded in place and the engine client
  decodes events where they lie (``Response.iter_in_place``), so no received byte is copied by the
  proxy (aiohttp's client hands out a ``bytes`` per read and copies again to assemble events).
  A cumulative 16k-token stream cost 240-241 us of proxy CPU per token against 270 with the
  three copies it made before (``bench long_outputs``, runs interleaved, load 0.6-1.3); on
  2026-12-05 it costs 182-198 (five runs, load 0.4-1.7, incremental 108-113 beside it) and
  208-213 in three evening runs (load 0.4-2.8, incremental 147-168 beside it), one read and
  one reader step per chunk, its growth from 1k tokens the kernel's copy and one memchr
  (``docs/cpu-stack.md``). It stays.
- ``gyre.real.store.commit_journal`` (one ``fdatasync`` per batch, whatever the number of logs
  it touched) instead of syncing each touched log, what it replaced: 0.034 ms of CPU per
  record against 0.093 ms, and 2.8 ms against 5.5 ms of wall per burst of 64 records
  committed at once (steady state, runs within 3%, load 2.7). SQLite (WAL,
  ``synchronous=FULL``, one transaction per batch) costs the same CPU (0.034 ms) and 2.4 ms a
  burst on this disk, where a sync takes microseconds; it would replace the record logs every
  reader of records opens, not only the journal, so the journal stays: it is the cheaper way
  to make the logs as they are durable. For one client alone it buys nothing over syncing the
  log itself (one ``fdatasync`` either way: a 2 KB write and sync takes 0.13 ms at p50 on this
  disk, a group commit's round trip through its writer thread 0.33 ms; ``bench proxy``'s
  durability case, load 2.0). What a lone call pays on top is that hand-off
  (``recording``: the loop waits on a plain lock the writer releases, no loop wake-up, no
  future: added p50 +0.01 to -0.08 ms, median -0.06, and 0.03-0.08 ms less proxy CPU per
  call than a ``threading.Event`` plus a future settled through ``call_soon_threadsafe``;
  two proxies called in turn, eight runs, load 0.9-3.1: ``docs/cpu-stack.md#the-proxy-on-two-cores``).
  Committing a lone record on the loop's own thread (``GroupCommit.commit_here``) would spare
  the hand-off, but a stalled disk would then stall every call: not used. The GIL keeps the
  writer from starting its commit until the loop blocks, so a lone call's loop waits (on a plain
  lock, at most ``ALONE_WAIT_S``) right after handing the record over, until the writer has
  written it and only the journal's ``fdatasync`` is left; the loop's last work (the last
  events, the engine stream's end, the summary) then runs during the sync instead of before the
  whole commit: paired -0.025 to -0.046 ms (median -0.034), proxy CPU +0.02 to +0.03 ms per
  call, five in-turn runs, load 2.1-3.2, 2026-12-05 (an earlier form of this overlap measured
  +0.10 ms). Not used: telling a batch's callers as the writer's last act before it sleeps
  (paired +0.11 and -0.015 ms in ``bench in_turn``, load 3.7-4.2: no gain that shows).

The lone call as a whole, against the morning's main (``python -m bench in_turn``: two
proxies on one engine called in turn, five runs of 1,500 rounds, load 0.8-1.1): added p50
0.94-1.07 ms against 1.00-1.12 (the rounds' paired differences -0.027 to -0.055 ms), proxy CPU
1.17-1.21 ms per call against 1.20-1.25, after the record's checks, the body's decoding and
the Anthropic events' encoding were cut and the record's request-only hints moved to while
the engine generates; with the prefix cache's lookup cut too, in a slower phase (load
2.4-2.7), paired -0.033 to -0.054 ms, CPU -0.033 to -0.053 ms per call, added p50 1.16-1.24
ms against 1.21-1.27. With the lone record's sync overlapped and the call's whole output
decoded and parsed only for an answer that carries the text (``request.Finished.deferred``),
five more runs against main before them (6627093; load 0.7-0.8): paired -0.044 to -0.066 ms
(median -0.064), proxy CPU -0.013 to +0.013 ms per call, added p50 1.11-1.28 ms against
1.16-1.34, a slow phase of the machine in which the goal (< 1 ms) is met by neither
(``docs/cpu-stack.md#the-proxy-on-two-cores``). With the per-call work the loop did and
need not cut (the parse of a tagless output, the record's checks of short arrays in NumPy,
the id cache's copies, a landed record's future and timer, the sampling hints' JSON, the
``message_start`` built and encoded), against 4066770 (2026-12-05, load 1.5-2.1, in turn):
at one client paired -0.046 to -0.076 ms and 0.07-0.09 ms less proxy CPU per call (three
runs); at 64 clients 13% less loop CPU per call by the paired windows' median (four runs,
ratios 0.845-0.907) and 10-17% more calls/s; in alternating ``bench proxy`` runs the goals
move with the machine's phase more than with the version (64 clients met in 5 of 5 and 3
of 5 runs against 3 and 2 of 5 for main; a lone call under 1 ms in 3 of 5, then 0 of 5). On 2026-12-06
the group commit's writer sleeps on a plain lock instead of a ``threading.Condition`` (less
Python under the GIL around a lone record's two hand-offs): against d558f87 in turn, six runs
(load 1.1-1.3), paired -0.035 to +0.000 ms (median -0.018) and 0.01-0.04 ms less proxy CPU per
call; waking the writer ahead of the record, and the journal's write and sync in one
``RWF_DSYNC`` write, did not pay (``docs/cpu-stack.md#the-proxy-on-two-cores``).

What decides the lone call's figure now is this machine's disk. ``bench proxy`` calls, in each
round, the same proxy with its records on ``/dev/shm`` (no device behind its syncs): its added
p50 stayed at 0.66-0.74 ms in every run whose direct call took 0.45-0.50 ms, while the durable
proxy's was 0.72-0.81 ms when the sync added 0.04-0.08 ms (paired) and 1.24-1.35 ms when it added
0.51-0.63 ms, the disk's two phases of 2026-12-06 03:37-03:52 (27 runs, load 0.3-1.2). A synced
write that follows the disk's last by 0.1-0.3 ms costs 0.16-0.66 ms at p50 here, by 1.5 ms
0.75-1.15 ms, against 0.03-0.06 ms back to back (``python -m bench disk_sync``), and a lone call's
always follows the last by a millisecond or more.

May import: ``gyre`` (trajectory records, trees, tool-call cache) and
``gyre.real.store``. Never the runtime, the training cells or the engines'
manager: the proxy talks to engines over HTTP only.
"""
