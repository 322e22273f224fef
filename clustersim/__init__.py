"""clustersim, the application: every command of the ``clustersim`` CLI and what only commands use
(experiments, compare / report / plots, search, goodput, validation, resource guards, fault options).

It sits on top of the four libraries: ``simulator`` (the contract and the engine), ``topologies``,
``schedules`` and ``traces``. Nothing below imports it.
"""
__version__ = "0.1.0"
