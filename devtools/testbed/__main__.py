"""python -m devtools.testbed: builds the beds (see the package's docstring)."""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

from devtools.testbed import __doc__ as DOC
from devtools.testbed.beds import BEDS, FAMILY
from devtools.testbed.build import ROOT, build
from devtools.testbed.train import train_expert
from devtools.testbed.world import SINGLE, BedConfig


def main() -> int:
    parser = argparse.ArgumentParser(description=DOC, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bed", nargs="+", default=list(BEDS),
                        help=f"the beds to build (default: {', '.join(BEDS)}; the family's: {', '.join(FAMILY)}; "
                             "quick: a smoke test)")
    parser.add_argument("--force", action="store_true", help="train again even if the cache has the bed")
    parser.add_argument("--quick", action="store_true", help="a tiny, barely trained bed (a smoke test)")
    parser.add_argument("--train-one", choices=("high", "low", SINGLE), help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--config", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.train_one:  # a child of build(): one expert, one thread
        config = BedConfig.from_dict(json.loads(args.config))
        state, log = train_expert(args.train_one, config)
        os.makedirs(args.out, exist_ok=True)
        torch.save(state, os.path.join(args.out, "weights.pt"))
        with open(os.path.join(args.out, "log.json"), "w", encoding="utf-8") as f:
            json.dump(log, f)
        return 0
    for name in (["quick"] if args.quick else args.bed):
        bed = build(name, force=args.force)
        print(json.dumps({k: v for k, v in bed.log.items() if k != "training"}, indent=2))
    return 0


if __name__ == "__main__":
    if ROOT not in sys.path:
        sys.path.insert(0, ROOT)
    raise SystemExit(main())
