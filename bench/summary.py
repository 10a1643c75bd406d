"""Reads the JSON lines a bench/ script printed (Loom's `loom bench` lines and its peers' lines) and
prints one JSON summary line: per group (architecture, dtype, ranks), the median tokens/s and peak memory of each
program, and Loom's ratio to the strongest peer (the peer with the highest median tokens/s).

Memory is reported three ways, each a median: the whole process's peak RSS, its baseline (resident
with the runtime's libraries loaded, before the model is built) and the peak above that baseline
(the model, optimizer state and steps). `memory_vs_strongest` compares whole-process peaks (what a
machine must hold); `training_memory_vs_strongest` compares the peaks above each side's baseline
(what training itself needs, without a framework's resident libraries), where both report one.

    bench/lm_bench.sh ... | tee run.jsonl; python3 bench/summary.py < run.jsonl

Standard library only. Lines that are not JSON objects are ignored (mpirun's chatter).
"""
import json
import statistics
import sys


def program(d):
    """The name a line's program goes by: the peer's name, or loom with its plan."""
    if "peer" in d:
        return d["peer"] + ("" if d.get("torch_version", "").startswith("2") else "-" + d.get(
            "torch_version", "?").split("a")[0])
    tactics = d["plan"]["tactics"] if isinstance(d.get("plan"), dict) else []
    name = "loom" + "".join("-" + t.split(":")[0] for t in tactics)
    passes = d.get("passes", {})  # the scheduled stage's passes, where not their defaults
    if passes.get("bucket") == "none" and passes.get("prefetch") is False:
        name += "+nopasses"
    if passes.get("reshard_after_forward") is False:
        name += "+once"
    return name


def peak_memory(d):
    """The largest per-rank peak RSS in bytes, whatever the line calls it."""
    if "per_rank_peak_rss_bytes" in d:
        return max(d["per_rank_peak_rss_bytes"])
    ranks = [r.get("peak_rss_bytes", 0) for r in d.get("per_rank", [])]
    return max(ranks + [d.get("peak_rss_bytes", 0)])


def main():
    runs = {}
    for line in sys.stdin:
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            d = json.loads(line)
        except json.JSONDecodeError:
            continue
        if "tokens_per_s" not in d:
            continue
        ranks = len(d["per_rank"]) if "per_rank" in d else d.get("ranks", 1)
        group = (d.get("arch", "?"), d.get("dtype", "?"), ranks)
        runs.setdefault(group, {}).setdefault(program(d), []).append(d)
    out = []
    for (arch, dtype, ranks), programs in sorted(runs.items()):
        row = {"arch": arch, "dtype": dtype, "ranks": ranks, "programs": {}}
        for name, ds in sorted(programs.items()):
            row["programs"][name] = {
                "runs": len(ds),
                "tokens_per_s_median": statistics.median(d["tokens_per_s"] for d in ds),
                "peak_rss_bytes_median": statistics.median(peak_memory(d) for d in ds),
            }
            if all("baseline_rss_bytes" in d for d in ds):
                row["programs"][name]["baseline_rss_bytes_median"] = statistics.median(
                    d["baseline_rss_bytes"] for d in ds)
                row["programs"][name]["peak_above_baseline_bytes_median"] = statistics.median(
                    d["peak_above_baseline_bytes"] for d in ds)
            if any("compile_s" in d for d in ds):
                row["programs"][name]["compile_s_median"] = statistics.median(
                    d["compile_s"] for d in ds if "compile_s" in d)
        peers = {n: p for n, p in row["programs"].items() if not n.startswith("loom")}
        if peers:
            best = max(peers, key=lambda n: peers[n]["tokens_per_s_median"])
            row["strongest_peer"] = best
            for name, p in row["programs"].items():
                if name.startswith("loom"):
                    p["speed_vs_strongest"] = p["tokens_per_s_median"] / peers[best]["tokens_per_s_median"]
                    p["memory_vs_strongest"] = p["peak_rss_bytes_median"] / peers[best]["peak_rss_bytes_median"]
                    mine, theirs = (p.get("peak_above_baseline_bytes_median"),
                                    peers[best].get("peak_above_baseline_bytes_median"))
                    if mine is not None and theirs:
                        p["training_memory_vs_strongest"] = mine / theirs
        out.append(row)
    print(json.dumps({"summary": out}))


if __name__ == "__main__":
    main()
