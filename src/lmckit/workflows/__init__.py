"""What one command does end to end, callable from Python: match two checkpoints or model
folders (:mod:`~lmckit.workflows.matching`), interpolate (:mod:`~lmckit.workflows.interpolation`),
analyse (:mod:`~lmckit.workflows.analysis`), merge (:mod:`~lmckit.workflows.merging`), train
seeds (:mod:`~lmckit.workflows.training`), and the estimates that refuse work that would not
fit (:mod:`~lmckit.workflows.estimates`).

Each stores its results in the keyed :mod:`lmckit.store`; the experiment engine
(:mod:`lmckit.experiments`) runs its jobs through these same functions. Layers: the command
line and the engine import this package; this package imports the library below it, never
the engine.
"""
