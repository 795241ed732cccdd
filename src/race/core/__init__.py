"""The floor every stage stands on: the study's vocabulary, with no torch and no stage imports.

The error type (:mod:`.errors`), the config schema and its defaults (:mod:`.schema`), the
ladder's dimensions as plain numbers (:mod:`.ladder`), cells, rungs and the results layout
(:mod:`.cells`), the typed config sections (:mod:`.specs`) and the typed study they make up
(:mod:`.study`), the job dataclasses and their JSON (:mod:`.jobs`), the atomic writer
(:mod:`.atomic`), validated reads of JSON outputs (:mod:`.outputs`) and the CPU kernel pin
(:mod:`.cpu_kernels`). The stages sit above it in one order (``tests/test_layout.py``).
"""
