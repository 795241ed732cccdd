"""The pinned CPU kernel path: which machines get it, that a user's choice wins, and that
importing race pins the kernels torch actually computes with."""

import os
import subprocess
import sys

import pytest

from race.core.cpu_kernels import PINNED, cpu_vendor, has_avx2, pin_cpu_kernels

X86_AVX2 = "processor\t: 0\nflags\t\t: fpu sse sse2 avx avx2 fma bmi2\n"
X86_OLD = "processor\t: 0\nflags\t\t: fpu sse sse2 avx\n"


def test_has_avx2_reads_the_flags_of_x86_machines_only():
    assert has_avx2(X86_AVX2, "x86_64")
    assert has_avx2(X86_AVX2, "AMD64")
    assert not has_avx2(X86_OLD, "x86_64")  # AVX2 kernels would crash here
    assert not has_avx2(X86_AVX2, "aarch64")  # other architectures keep their own kernels
    assert not has_avx2("processor\t: 0\n", "x86_64")  # no flags line: unknown, not pinned


def test_the_vendor_is_read_from_cpuinfo():
    # MKL's pinned branch holds on Intel processors only, so a run records whose processor it
    # computed on.
    assert cpu_vendor("processor\t: 0\nvendor_id\t: AuthenticAMD\n" + X86_AVX2) == "AuthenticAMD"
    assert cpu_vendor("vendor_id\t: GenuineIntel\n") == "GenuineIntel"
    assert cpu_vendor(X86_AVX2) == "unknown"  # no vendor line (e.g. some ARM kernels)


def test_pin_sets_what_is_unset_and_keeps_the_users_choice():
    env = {}
    assert pin_cpu_kernels(env, avx2=True) == PINNED
    assert env == PINNED
    env = {"ATEN_CPU_CAPABILITY": "avx512"}
    assert pin_cpu_kernels(env, avx2=True) == {"MKL_CBWR": "AVX2"}
    assert env["ATEN_CPU_CAPABILITY"] == "avx512"
    env = {}
    assert pin_cpu_kernels(env, avx2=False) == {}
    assert env == {}


def _capability_after_import(env_extra: dict) -> str:
    env = {k: v for k, v in os.environ.items() if k not in PINNED}
    code = ("import torch, race; x = torch.ones(4) @ torch.ones(4); "
            "print(torch.backends.cpu.get_cpu_capability())")
    return subprocess.run([sys.executable, "-c", code], env={**env, **env_extra}, check=True,
                          capture_output=True, text=True).stdout.strip()


@pytest.mark.skipif(not has_avx2(), reason="pinning applies to x86-64 machines with AVX2")
def test_importing_race_pins_the_kernels_torch_computes_with():
    # torch is imported first, as scripts sorted by isort do: the path is chosen at the first
    # kernel call, after race has set it.
    assert _capability_after_import({}) == "AVX2"
    assert _capability_after_import({"ATEN_CPU_CAPABILITY": "default"}) == "DEFAULT"
