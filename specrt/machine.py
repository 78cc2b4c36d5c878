"""The machine a benchmark ran on: CPU, cores, memory, load, OS and the versions that matter
to its numbers (``specrt bench``'s report, tools/ benchmarks). Part of the package, so a
report is complete without the repository's tools/."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import re
from pathlib import Path


def mem_available(root: Path = Path("/")) -> int | None:
    """Bytes of memory available to new processes, if known: /proc/meminfo's MemAvailable, or
    less where this process's memory cgroup is limited (a container: MemAvailable is the
    host's, and a build past the container's limit was killed with no word said), the limit
    less what the group uses but could not reclaim (its inactive page cache reclaimable).
    ``root``: where /proc and /sys are (tests)."""
    avail = None
    try:
        for line in (root / "proc/meminfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("MemAvailable:"):
                avail = int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    room = cgroup_room(root)
    return room if avail is None else avail if room is None else min(avail, room)


def read_or_none(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except OSError:
        return None


def cgroup_mounts(mountinfo: str, root: Path = Path("/")) -> list[tuple[Path, str, frozenset[str] | None]]:
    """The cgroup file systems /proc/self/mountinfo lists: (mount point under ``root``, the
    cgroup path the mount shows as its root, its v1 controllers; None for cgroup v2). A v1
    controller may share a hierarchy with others (``memory,hugetlb``) or be mounted outside
    /sys/fs/cgroup: only the mount table says where."""
    mounts = []
    for line in mountinfo.splitlines():
        left, sep, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if not sep or len(fields) < 6 or len(tail) < 3 or tail[0] not in ("cgroup", "cgroup2"):
            continue
        point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), fields[4])  # (spaces are \040)
        controllers = None if tail[0] == "cgroup2" else frozenset(tail[2].split(","))
        mounts.append((root / point.lstrip("/"), fields[3], controllers))
    return mounts


def cgroup_levels(proc_cgroup: str, controller: str, mountinfo: str | None, fallback: Path,
                  v1_names: tuple[str, ...], root: Path = Path("/")) -> list[tuple[list[Path], bool]]:
    """For each of this process's cgroups (``proc_cgroup``: /proc/self/cgroup) that holds
    ``controller``: its folder and each above it up to its mount's root (the group first), and
    whether it is cgroup v2. Mounts come from ``mountinfo`` (cgroup_mounts, under ``root``); where it is
    unknown or lists none for a group, the usual places: ``fallback`` (/sys/fs/cgroup) for v2,
    ``fallback``/NAME for each of ``v1_names`` for v1. A container sees its own group as the
    mount's root, where the path /proc names may not exist: the levels above are still there."""
    mounts = cgroup_mounts(mountinfo, root) if mountinfo is not None else []
    found = []
    for line in proc_cgroup.splitlines():
        _, listed, path = (line.split(":", 2) + ["", ""])[:3]
        v2 = listed == ""
        if not v2 and controller not in listed.split(","):
            continue
        places = [(point, top) for point, top, held in mounts
                  if (held is None if v2 else held is not None and controller in held)]
        if not places:
            places = [(fallback, "/")] if v2 else [(fallback / name, "/") for name in v1_names]
        for mount, top in places:
            top, shown = top.rstrip("/"), path.strip()
            if top and (shown == top or shown.startswith(top + "/")):  # (the mount shows this part of the tree)
                shown = shown[len(top):]
            parts = [p for p in shown.split("/") if p]
            found.append(([mount.joinpath(*parts[:depth]) for depth in range(len(parts), -1, -1)], v2))
    return found


def cgroup_room(root: Path = Path("/")) -> int | None:
    """Bytes this process's memory cgroup (v2, or v1's memory controller) can still take: the
    least, over its group and each group above it up to the mount's root, of a limited group's
    limit less its usage (inactive page cache counted free); None without a limit or where
    none can be read. (A limit on a parent binds too: a systemd slice's MemoryMax, a Slurm
    job's, a container's root with the processes in a child group.)"""
    proc_cgroup = read_or_none(root / "proc/self/cgroup")
    if proc_cgroup is None:
        return None
    rooms = []
    for levels, v2 in cgroup_levels(proc_cgroup, "memory", read_or_none(root / "proc/self/mountinfo"),
                                    root / "sys/fs/cgroup", ("memory",), root):
        # v2: memory.max, memory.current, memory.stat's inactive_file; v1's total_ counts the group's children too
        names = ("memory.max", "memory.current", "inactive_file") if v2 else \
            ("memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file")
        for folder in levels:
            try:
                limit = (folder / names[0]).read_text(encoding="utf-8").strip()
                used = int((folder / names[1]).read_text(encoding="utf-8"))
                rows = (folder / "memory.stat").read_text(encoding="utf-8").splitlines()
                stat = dict(ln.split() for ln in rows if ln.count(" ") == 1)
            except (OSError, ValueError):
                continue
            if limit.isdigit() and int(limit) < 2 ** 60:  # ("max", or v1's "no limit" of ~2**63: none here)
                rooms.append(max(0, int(limit) - used + int(stat.get(names[2], 0))))
    return min(rooms) if rooms else None


def load_average() -> list[float] | None:
    """The 1, 5 and 15-minute load averages; None where the OS has none (Windows: bench's
    workers failed at their start, an AttributeError)."""
    return list(os.getloadavg()) if hasattr(os, "getloadavg") else None


def dist_version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def machine_info(threads: int) -> dict:
    """CPU model, cores, memory, load, OS and the versions that matter to the numbers."""
    cpu_model, flags = platform.processor() or "unknown", set()
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            k, _, v = line.partition(":")
            if k.strip() == "model name" and cpu_model in ("unknown", "", "x86_64"):
                cpu_model = v.strip()
            elif k.strip() == "flags" and not flags:
                flags = set(v.split())
    except OSError:
        pass
    mem_total = None
    try:
        for line in Path("/proc/meminfo").read_text(encoding="utf-8").splitlines():
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
        "load_average_at_start": load_average(),
        "os": platform.platform(),
        "python": platform.python_version(),
        "versions": {d: dist_version(d) for d in ("specrt", "numpy", "onnxruntime", "onnxruntime-genai",
                                                  "llama-cpp-python", "torch", "transformers", "tokenizers")},
    }
