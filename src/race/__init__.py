"""RACE: where should a fixed RL post-training FLOP budget go? (see docs/design.md).

Importing the package pins the CPU kernel path (:mod:`race.core.cpu_kernels`): every process of a
study -- the Snakemake scheduler, the jobs it starts, tests and benchmarks -- imports ``race``
before it computes a tensor, so a study computes on the same kernels on every x86-64 machine
with AVX2 (how far that carries across machines: race.core.cpu_kernels).
"""

from race.core.cpu_kernels import pin_cpu_kernels

pin_cpu_kernels()
