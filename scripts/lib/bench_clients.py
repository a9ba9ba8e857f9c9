"""Measures the official clients side by side through their conformance
drivers (the bench ops of conformance/README.md) against one running server,
alternating the clients over the runs, and writes a table of medians with
ratios to the Rust client. Run by scripts/bench-clients, which builds and
starts everything first; the standard library only.
"""

import argparse
import json
import statistics
import subprocess
import sys
import time


class Driver:
    """One client's driver process."""

    def __init__(self, client):
        self.client = client
        self.proc = subprocess.Popen(
            [f"conformance/drivers/{client}/run"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def ask(self, request):
        """Sends `request`; the answer (progress lines skipped)."""
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        while True:
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError(f"the {self.client} driver exited")
            answer = json.loads(line)
            if "ok" in answer:
                if not answer["ok"]:
                    raise RuntimeError(f"{self.client}: {request['op']}: {answer}")
                return answer

    def close(self):
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


def measure(client, endpoint, args):
    """One run of the three measures for `client`."""
    d = Driver(client)
    try:
        d.ask({"op": "open", "endpoints": [endpoint]})
        d.ask({"op": "next_ids", "count": 1000})  # connect, warm up
        s = d.ask({"op": "bench_stream", "total": args.stream_ids, "batch_size": 10000})
        u = d.ask({"op": "bench_unary", "concurrency": 50, "seconds": args.seconds})
        p = d.ask({"op": "bench_pool", "count": 40000})
        d.ask({"op": "close"})
    finally:
        d.close()
    return {
        "stream_ids_per_s": s["ids"] / s["seconds"],
        "unary_calls_per_s": u["calls"] / args.seconds,
        "unary_p99_ms": u["p99_ms"],
        "pool_ns_per_id": p["ns_per_id"],
    }


def table(results, clients):
    """The markdown table of medians, with ratios to Rust where it ran."""
    med = {
        c: {k: statistics.median(r[k] for r in results[c]) for k in results[c][0]}
        for c in clients
    }
    base = med.get("rust")

    def ratio(c, k):
        return f" ({med[c][k] / base[k]:.3f}×)" if base and c != "rust" else ""

    rows = [
        "| client | stream ids/s | unary next_ids(1) calls/s at 50 | unary p99 ms | pool next() ns/id |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for c in clients:
        m = med[c]
        rows.append(
            f"| {c} | {m['stream_ids_per_s']:,.0f}{ratio(c, 'stream_ids_per_s')} "
            f"| {m['unary_calls_per_s']:,.0f}{ratio(c, 'unary_calls_per_s')} "
            f"| {m['unary_p99_ms']:.2f}{ratio(c, 'unary_p99_ms')} "
            f"| {m['pool_ns_per_id']:.0f}{ratio(c, 'pool_ns_per_id')} |"
        )
    return "\n".join(rows) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--endpoint", required=True)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5)
    parser.add_argument("--stream-ids", type=int, default=20_000_000)
    parser.add_argument("--clients", default="rust,go,java,typescript,python")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    clients = args.clients.split(",")
    results = {c: [] for c in clients}
    for run in range(args.runs):
        for c in clients:
            started = time.monotonic()
            results[c].append(measure(c, args.endpoint, args))
            print(
                f"run {run + 1}/{args.runs} {c}: {results[c][-1]} "
                f"({time.monotonic() - started:.1f} s)",
                file=sys.stderr,
            )
    text = (
        f"Medians of {args.runs} runs, alternating the clients, against one "
        f"snowkeep-server (release, single-instance store, layout 41/12/10: "
        f"1,024,000 ids/s per machine id).\n\n" + table(results, clients)
    )
    with open(args.out, "w", encoding="utf-8") as f:
        f.write(text)
    print(text)


if __name__ == "__main__":
    main()
