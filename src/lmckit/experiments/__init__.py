"""The experiment engine: an experiment file (:mod:`~lmckit.experiments.schema`) expanded into
a job graph (:mod:`~lmckit.experiments.dag`), its steps (:mod:`~lmckit.experiments.steps`,
which call :mod:`lmckit.workflows`) run by an executor (local processes or Ray), recorded in
a SQLite ledger and reported as HTML; the demo is an experiment file run by it.

The single-command workflows that lived here moved to :mod:`lmckit.workflows` and the keyed
store to :mod:`lmckit.store`; their old import paths (``lmckit.experiments.matching`` …) are
kept for one release by :mod:`lmckit._moved`.
"""
