"""The projector: folds the topics into the PostgreSQL read models (exactly-once)."""
