"""Slurm hostlist expansion for the fake ``srun``/``scontrol``: ``node[1-3,7],gpu01`` -> names."""

import re


def expand(hostlist: str) -> list[str]:
    names = []
    for prefix, ranges, suffix in re.findall(r"([^,\[]*)(?:\[([^\]]*)\])?([^,\[]*),?", hostlist):
        if not prefix and not ranges:
            continue
        if not ranges:
            names.append(prefix + suffix)
            continue
        for part in ranges.split(","):
            first, _, last = part.partition("-")
            for number in range(int(first), int(last or first) + 1):
                names.append(f"{prefix}{number:0{len(first)}d}{suffix}")
    return names
