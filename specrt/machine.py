"""The machine a benchmark ran on: CPU, cores, memory, load, OS and the versions that matter
to its numbers (``specrt bench``'s report, tools/ benchmarks). Part of the package, so a
report is complete without the repository's tools/."""

from __future__ import annotations

import importlib.metadata
import os
import platform
from pathlib import Path


def mem_available() -> int | None:
    """Bytes of memory available to new processes (/proc/meminfo MemAvailable), if known."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def dist_version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def machine_info(threads: int) -> dict:
    """CPU model, cores, memory, load, OS and the versions that matter to the numbers."""
    cpu_model, flags = platform.processor() or "unknown", set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            k, _, v = line.partition(":")
            if k.strip() == "model name" and cpu_model in ("unknown", "", "x86_64"):
                cpu_model = v.strip()
            elif k.strip() == "flags" and not flags:
                flags = set(v.split())
    except OSError:
        pass
    mem_total = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_total = int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        from specrt.engines.onnxruntime import cgroup_cpu_limit, physical_cores

        phys, limit = physical_cores(), cgroup_cpu_limit()
    except Exception:  # pragma: no cover - specrt not importable
        phys = limit = None
    try:
        affinity = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover
        affinity = os.cpu_count()
    isa = [f for f in ("avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16", "amx_tile")
           if f in flags]
    return {
        "cpu_model": cpu_model,
        "logical_cpus": os.cpu_count(),
        "cpus_in_affinity": affinity,
        "physical_cores": phys,  # no more than the cgroup CPU limit, rounded up
        "cgroup_cpu_limit": limit,  # CPUs (quota / period); None: unlimited
        "threads": threads,
        "isa": isa,
        "memory_bytes": mem_total,
        "load_average_at_start": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "os": platform.platform(),
        "python": platform.python_version(),
        "versions": {d: dist_version(d) for d in ("specrt", "numpy", "onnxruntime", "onnxruntime-genai",
                                                  "llama-cpp-python", "torch", "transformers", "tokenizers")},
    }
