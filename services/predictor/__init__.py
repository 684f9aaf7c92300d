"""predictor: the speed predictor per GPU type (MuxFlow preprint §3, §5, §6, §7.4).

Publishes an analytic estimate as version 1 at once, bootstraps a 4-layer, 64-wide MLP
(momentum SGD, torch) from simulator-generated pairs, retrains it when enough sharing
observations arrived. Every version goes on `predictor.models` (weights and metadata), in use
only if its held-out error is not worse (refused ones ``published=False``); PostgreSQL mirrors
them. Training happens when the predictor consumes its own clock tick, so the log replays it.
"""
