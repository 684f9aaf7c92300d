"""MuxFlow's speed predictor: the normalized throughput (and online slowdown) of an offline job
beside an online workload at an SM share, per GPU type (preprint §3 "Speed predictor", §5
``P.CalcNormTput(u, v, sm)`` of Algorithm 1, §6 implementation, §7.4 accuracy). Pure: no I/O,
no clock; the predictor service (`hivemux.services.predictor`) moves events in and out.

Modules, by the paper's parts:
- `features`    the inputs and outputs: `FEATURES`, the one definition of the input row ("GPU
                utilization, SM activity, SM occupancy, separate execution time, and assigned
                SM percentage", §5), `PairFeatures` (its row builder), `SpeedPrediction`, and
                the `SpeedModel` interface the matcher calls;
- `speed_predictor`  the MLP: four layers, hidden size 64, momentum SGD, one per GPU type (§5,
                §6, §7.4): `MlpSpeedModel`, `fit`, `TrainingSettings`, `Dataset`;
- `analytic`    version 1 of every GPU type: a two-parameter estimate published at once, so the
                matcher works while the MLP trains (not in the paper; calibrated on §2.3);
- `bootstrap`   the first training set, "about 2,000 data for each GPU type" (§6), labelled by
                the simulated interference model: `simulated_pairs`;
- `training_set` what sharing really did: sharing observations joined with profiles into rows;
- `retraining`  when to retrain (`RetrainPolicy`) and when a new version is published (held-out
                error not worse: `train_version`); the paper trains once, hivemux keeps learning;
- `predictor`   the deciding core (`PredictorCore`): versions in use per GPU type, analytic v1,
                the next type due, accepting or refusing a trained version, in event time;
- `predictor_events` its edge: events in, `PredictorModel` events out, decisions on the
                predictor's own clock ticks (`PredictorEvents`).

Section numbers are the preprint's (`muxflow-2024-preprint.txt`); the journal version
(`muxflow-journal.txt`) leaves the matching-based scheduling and its predictor out.
"""
