"""The HTTP API (issue 17): a stateless edge over the read models and the bus
(ARCHITECTURE.md "The log as the system of record").

It authenticates each request's bearer token (`store.tokens`), checks what the principal may do
(a tenant acts on its VCs' jobs and lists only those; drain, undrain and cell configuration need
an admin token), reads the PostgreSQL read models the projector writes (the queries `hivemux jobs`,
`gpus`, `vcs` and `status` use) and writes only by publishing the command events the CLI
publishes (`hivemux.commands`), each carrying the principal. Nothing is kept in the process but
a pool, a producer and the change feed's last cursor, so several instances can run.

- `app.create_app`: the FastAPI application (OpenAPI at ``/openapi.json``), its routers in
  `routers/` (jobs, cluster, admin, tokens, stream);
- `changes.ChangeFeed`: one poller per process that reads what the projector wrote since the
  last tick (by log position) and fans it out to every connected change-stream client;
- `views`: the JSON shapes of jobs, GPUs and events (shared with the CLI's ``--json``);
- `client`: the CLI's client when ``HIVEMUX_API_URL`` is set.

This package's ``__init__`` imports nothing heavy: the CLI imports `views` and `client` without FastAPI.
"""
