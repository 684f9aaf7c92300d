"""predictor: publishes the speed predictor per GPU type (MuxFlow §5.2).

This first version publishes an analytic estimate of an offline job's normalized throughput
and of the online slowdown (`hivemux.prediction.analytic`) for every configured GPU type,
once (versions already on the models topic are not re-published), and counts the sharing
observations it will train the MLP on. The MLP, its training and retraining come with the
prediction issue.
"""
