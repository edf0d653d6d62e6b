#!/usr/bin/env python3
"""The prefix-cache table of adapters/mlx/DIVERGENCES-vllm-mlx.md: store × cache kind ×
hit kind, from the work folders of prefix replays (adapters/mlx/vllm_mlx_replay.sh, one
per store), in markdown.

  STORE=S bash adapters/mlx/vllm_mlx_replay.sh build/ci/tools/kvlab W/S   # for each store S
  tools/prefix_store_table.py W/vllm-mlx W/vllm-mlx-kvq W/vllm-mlx-manager W/vllm-mlx-paged

A folder's name is its store (kvlab_mlx/engines.py VLLM_MLX_STORES, MLX_VLM_STORES). Cells as in
tools/cache_replay_table.py --hits: a script that agrees counts under every hit kind its
requests reached, a divergent one under the kind of the last request it reached; the
requests are classified by kvlab's rule, so every store has the same rows. Scripts that
reached no request (no g, or stopped before one) are counted apart. Standard library only.
"""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cache_replay_table as crt  # noqa: E402

NAMES = {"vllm-mlx": "MemoryAwarePrefixCache", "vllm-mlx-kvq": "MemoryAwarePrefixCache kv_quantize",
         "vllm-mlx-manager": "PrefixCacheManager", "vllm-mlx-paged": "BlockAwarePrefixCache (blocks of 2)",
         "mlx-vlm-apc": "mlx-vlm APC (blocks of 1)", "mlx-vlm-apc-kvq": "mlx-vlm APC kv_quant_config"}
HITS = ("exact", "prefix", "supersequence", "lcp", "after trim", "miss")
COLS = ("scripts", "agree", "representation", "upstream-bug", "kvlab-bug", "unclassified", "not replayed")


def main(folders):
    if not folders:
        print(__doc__, file=sys.stderr)
        return 2
    print("| store | kind | hit kind | " + " | ".join(COLS) + " |")
    print("|---|---|---|" + "---|" * len(COLS))
    for folder in folders:
        store = os.path.basename(os.path.normpath(folder))
        replay = []
        for part in ("tier", "random"):
            with open(os.path.join(folder, f"{part}.replay.json"), encoding="utf-8") as f:
                replay += json.load(f)
        with open(os.path.join(folder, "judged.jsonl"), encoding="utf-8") as f:
            judged = [json.loads(line) for line in f if line.strip()]
        rows = crt.table(replay, judged, crt.read_hits(os.path.join(folder, "hits.jsonl")))
        for kind in ("kv", "rotating", "quantized"):
            for hit in HITS + ("no request",):
                counts = rows.get(f"{kind} {hit}")
                if counts:
                    print(f"| {NAMES.get(store, store)} | {kind} | {hit} | " + " | ".join(str(counts[c]) for c in COLS) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
