#!/usr/bin/env python3
"""The ops that take most of a step, from `loom bench --profile`'s first stderr line.

    python3 bench/gpu/profile_top.py PROFILE.txt [N]
"""
import json
import sys


def main(argv):
    if not argv:
        sys.exit(__doc__)
    try:
        with open(argv[0]) as f:
            p = json.loads(f.readline())
    except (OSError, ValueError) as e:
        sys.exit(f"profile_top.py: {argv[0]}: {e}")
    n = int(argv[1]) if len(argv) > 1 else 14
    total = sum(v["ms_per_step"] for v in p.values())
    print(f"profile: {total:.1f} ms per step in ops (each node stamped on the stream, no graph)")
    for op, v in sorted(p.items(), key=lambda kv: -kv[1]["ms_per_step"])[:n]:
        print(f"  {op:30s} {v['ms_per_step']:9.2f} ms {100 * v['ms_per_step'] / total:5.1f}%"
              f"  x{v['calls']}")


if __name__ == "__main__":
    main(sys.argv[1:])
