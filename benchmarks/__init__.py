"""The benchmarks, beside the package and outside its wheel: ``python -m benchmarks <name> …`` runs one,
``python -m benchmarks --help`` lists them. Each module here measures one thing (its docstring says what
and where it writes); :mod:`benchmarks.harness` owns the command line, the timers, the process isolation
and the result writers they share."""
