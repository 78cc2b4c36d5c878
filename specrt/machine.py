"""The machine a benchmark ran on: CPU, cores, memory, load, OS and the versions that matter
to its numbers (``specrt bench``'s report, tools/ benchmarks). Part of the package, so a
report is complete without the repository's tools/."""

from __future__ import annotations

import importlib.metadata
import os
import platform
from pathlib import Path


def mem_available(root: Path = Path("/")) -> int | None:
    """Bytes of memory available to new processes, if known: /proc/meminfo's MemAvailable, or
    less where this process's memory cgroup is limited (a container: MemAvailable is the
    host's, and a build past the container's limit was killed with no word said), the limit
    less what the group uses but could not reclaim (its inactive page cache reclaimable).
    ``root``: where /proc and /sys are (tests)."""
    avail = None
    try:
        for line in (root / "proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                avail = int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    room = cgroup_room(root)
    return room if avail is None else avail if room is None else min(avail, room)


def cgroup_room(root: Path = Path("/")) -> int | None:
    """Bytes this process's memory cgroup (v2, or v1's memory controller) can still take: the
    least, over its group and each group above it up to the mount's root, of a limited group's
    limit less its usage (inactive page cache counted free); None without a limit or where
    none can be read. (A limit on a parent binds too: a systemd slice's MemoryMax, a Slurm
    job's, a container's root with the processes in a child group.)"""
    try:
        lines = (root / "proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    rooms = []
    for line in lines:
        _, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        if controllers == "":  # v2: memory.max, memory.current, memory.stat's inactive_file
            names, base = ("memory.max", "memory.current", "inactive_file"), root / "sys/fs/cgroup"
        elif "memory" in controllers.split(","):  # v1 (its total_ counts the group's children too)
            names, base = ("memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file"), \
                root / "sys/fs/cgroup/memory"
        else:
            continue
        leaf = base / path.strip("/")
        # the group and those above it; a container sees its own group as the mount's root,
        # where the path /proc names may not exist
        for folder in [leaf, *(base / p for p in leaf.relative_to(base).parents)]:
            try:
                limit = (folder / names[0]).read_text().strip()
                used = int((folder / names[1]).read_text())
                stat = dict(ln.split() for ln in (folder / "memory.stat").read_text().splitlines() if ln.count(" ") == 1)
            except (OSError, ValueError):
                continue
            if limit.isdigit() and int(limit) < 2 ** 60:  # ("max", or v1's "no limit" of ~2**63: none here)
                rooms.append(max(0, int(limit) - used + int(stat.get(names[2], 0))))
    return min(rooms) if rooms else None


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
