"""The ``hivemux`` command: ``main.py`` (click commands: up, service, submit, status, topics,
schemas, cells, health, sim), ``up.py`` (every service plus the embedded broker and database),
``jobfile.py`` (job files in HiveD's terms), ``services.py`` (the service registry)."""
