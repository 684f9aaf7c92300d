"""predictor: the speed predictor per GPU type (MuxFlow preprint §3, §5, §6, §7.4).

Publishes an analytic estimate as version 1 at once, bootstraps a 4-layer, 64-wide MLP
(momentum SGD, torch) from simulator-generated pairs, retrains it when enough sharing
observations arrived, records every version in PostgreSQL and publishes a new one (weights and
metadata on `predictor.models`) only if its held-out error is not worse.
"""
