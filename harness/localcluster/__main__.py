"""``python -m harness.localcluster``: manage a cluster made by LocalCluster.

python -m harness.localcluster status BASE
python -m harness.localcluster stop BASE
python -m harness.localcluster stop-slurmd BASE NODE
python -m harness.localcluster start-slurmd BASE NODE
python -m harness.localcluster restart-slurmctld BASE
"""

from __future__ import annotations

import argparse
import sys

from .cluster import LocalCluster


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.localcluster", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("status", "stop", "restart-slurmctld"):
        sub.add_parser(name).add_argument("base")
    for name in ("stop-slurmd", "start-slurmd"):
        per_node = sub.add_parser(name)
        per_node.add_argument("base")
        per_node.add_argument("node")
    args = parser.parse_args(argv)
    try:
        cluster = LocalCluster.load(args.base)
    except (OSError, ValueError, KeyError) as exc:
        print(f"localcluster: no cluster configured in {args.base} ({exc})", file=sys.stderr)
        return 2
    if args.command == "stop":
        cluster.stop()
        print(f"stopped the cluster in {args.base}")
    elif args.command == "status":
        pids = cluster.running_pids()
        for name, pid in sorted(pids.items()):
            print(f"{name}: pid {pid}")
        if not pids:
            print("not running")
    elif args.command == "restart-slurmctld":
        cluster.restart_slurmctld()
    else:
        if args.node not in [n.name for n in cluster.nodes]:
            print(f"localcluster: {args.node} is not a node of {args.base}", file=sys.stderr)
            return 2
        (cluster.stop_slurmd if args.command == "stop-slurmd" else cluster.start_slurmd)(args.node)
    return 0


if __name__ == "__main__":
    sys.exit(main())
