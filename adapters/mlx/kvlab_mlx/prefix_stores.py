"""vllm-mlx's prefix stores behind one small interface, so the prefix replay
(kvlab_mlx/prefix_replay.py) drives each the way vllm-mlx's scheduler does, and a shadow
of kvlab's own matching rule (cache/prefix_cache.h) that says how many tokens kvlab's
PrefixCache reuses for the same request.

Each store answers fetch(tokens) with (cache or None, tokens reused, match kind), the
cache being owned by the caller: vllm-mlx copies a hit before anything is written into
it (MemoryAwarePrefixCache.clone_for_replay; mlx-lm's BatchGenerator merges a legacy
PrefixCacheManager hit into a new batch cache), so the replay copies too.
"""

from __future__ import annotations

import copy
import logging


class MemoryAwareStore:
    """vllm_mlx/memory_cache.py. kv_quantize=(bits, group) turns on the store's option that
    keeps plain KVCache layers quantized (from the first token: kv_min_quantize_tokens 1)."""

    judge_reuse = False  # its policy is kvlab's model; X1-X3 are judged as they were found

    def __init__(self, kv_quantize=None):
        from vllm_mlx.memory_cache import MemoryAwarePrefixCache, MemoryCacheConfig

        # any prefix length reuses (min_prefix_tokens 1, not 128) and a 256 MB budget these
        # scripts never fill, as kvlab's store is configured
        extra = {}
        if kv_quantize:
            extra = dict(kv_quantize=True, kv_bits=kv_quantize[0], kv_group_size=kv_quantize[1],
                         kv_min_quantize_tokens=1)
        self.quantizes = kv_quantize
        self.s = MemoryAwarePrefixCache(object(), MemoryCacheConfig(max_memory_mb=256, min_prefix_tokens=1, **extra))

    def store(self, tokens, cache):
        self.s.store(list(tokens), [cache])

    def fetch(self, tokens):
        got, remaining = self.s.fetch(list(tokens))
        if got is None:
            return None, 0, getattr(self.s, "_last_match_type", "miss")
        clone = self.s.clone_for_replay(got)
        if clone is None:
            raise ValueError("the engine's store refused to clone its own entry for replay")
        return clone[0], len(tokens) - len(remaining), getattr(self.s, "_last_match_type", "?")


class ManagerStore:
    """vllm_mlx/prefix_cache.py's PrefixCacheManager (the scheduler's legacy, entry-count
    store). It keeps the cache object it is given and returns it by reference, so the
    replay hands over a copy (the scheduler stores a request's extracted cache and never
    writes it again) and copies a hit (as the batch merge does)."""

    judge_reuse = True  # its policy differs from kvlab's: every hit is compared with kvlab's
    quantizes = None

    def __init__(self):
        from vllm_mlx.prefix_cache import PrefixCacheManager

        self.s = PrefixCacheManager(object(), max_entries=1000)  # never evicts under these scripts

    def store(self, tokens, cache):
        self.s.store_cache(list(tokens), [copy.deepcopy(cache)])

    def fetch(self, tokens):
        exact, shorter, longer, _ = self.s._search(list(tokens))  # which branch fetch_cache takes
        match = "exact" if exact else "prefix" if shorter else "supersequence" if longer else "miss"
        got, remaining = self.s.fetch_cache(list(tokens))
        if got is None:
            return None, 0, "miss"
        return copy.deepcopy(got[0]), len(tokens) - len(remaining), match

    def keys(self):
        return [list(t) for (_, t) in self.s._lru]


class KvlabPolicy:
    """kvlab's PrefixCache rule over token keys alone (cache/prefix_cache.h, default
    Config): exact reuses all, a stored prefix reuses itself, a trimmable longer or
    diverging entry reuses min(lcp, n - 1); most reused wins, ties to the fewer trimmed;
    inserting a trimmable entry drops its stored proper prefixes. No eviction: these
    scripts store at most ten entries (kvlab's default keeps 64)."""

    def __init__(self):
        self.entries = {}  # tuple(tokens) -> trimmable

    def insert(self, tokens, trimmable):
        key = tuple(tokens)
        if trimmable:
            for other in [e for e in self.entries if len(e) < len(key) and key[:len(e)] == e]:
                del self.entries[other]
        self.entries[key] = trimmable

    def fetch(self, tokens):
        """(reused, kind) kvlab's store answers for the request."""
        t = tuple(tokens)
        best = (0, 0, "miss")  # (reused, -trimmed, kind)
        for e, trimmable in self.entries.items():
            lcp = next((i for i, (a, b) in enumerate(zip(e, t)) if a != b), min(len(e), len(t)))
            if e == t:
                cand = (len(t), 0, "exact")
            elif len(e) < len(t) and lcp == len(e):
                cand = (len(e), 0, "prefix")
            elif trimmable and lcp > 0:
                r = min(lcp, len(t) - 1)
                cand = (r, -(len(e) - r), "supersequence" if lcp == len(t) else "lcp")
            else:
                continue
            if cand[0] > 0 and cand[:2] > best[:2]:
                best = cand
        return best[0], best[2]


def check_against_oracle(problems):
    """KvlabPolicy against kvlab's own PrefixCache: in a kvlab vectors file the oracle's
    offset after each `g` is the count of tokens its store reused (PrefixFetch::reused), so
    replaying the rule over the script's keys must give the same count at every request.
    problems: (line, offsets after every command). Returns the lines of the disagreements."""
    from .cache_replay import parse_script
    from .problem import Problem

    bad = []
    for line, offsets in problems:
        p = Problem(line)
        kind, ring = p.word("kind"), p.int("max", 16)
        pol, log, offset = KvlabPolicy(), [], 0
        for step, (verb, n, _, ids) in enumerate(parse_script(p.word("script"))):
            trimmable = kind != "rotating" or offset < ring  # mlx-lm's is_trimmable rule
            if verb == "w":
                log += ids
            elif verb == "t" and trimmable:
                log = log[:max(0, len(log) - n)]
            elif verb == "i":
                pol.insert(log, trimmable)
            elif verb == "g":
                want, _ = pol.fetch(ids)
                if want != offsets[step]:
                    bad.append(f"{line}: {'g' + '_'.join(map(str, ids))}: the rule reuses {want}, "
                               f"kvlab's PrefixCache {offsets[step]}")
                    break
                log = list(ids[:want])
            offset = offsets[step]
    return bad


class BlockStore:
    """vllm_mlx/prefix_cache.py's BlockAwarePrefixCache over a PagedCacheManager (the
    scheduler's --use-paged-cache store), driven as the scheduler drives it: a stored
    cache goes in as its layers' extracted states (Scheduler._extract_cache_states) under
    a new request id, and a hit's block table is rebuilt by reconstruct_cache (a failed
    rebuild is the scheduler's miss). Blocks of 2 tokens, so these short scripts share
    blocks (the scheduler's default is 64)."""

    judge_reuse = True  # block granularity: every hit is compared with kvlab's rule
    quantizes = None
    block_size = 2

    def __init__(self):
        from vllm_mlx.paged_cache import PagedCacheManager
        from vllm_mlx.prefix_cache import BlockAwarePrefixCache

        # its warning per block it cannot slice (a ring's or a quantized layer's state) would
        # flood the test log; the findings it leads to (X9, X10) say it once each
        logging.getLogger("vllm_mlx.prefix_cache").setLevel(logging.ERROR)
        self.s = BlockAwarePrefixCache(object(), PagedCacheManager(block_size=self.block_size, max_blocks=4096))
        self.requests = 0
        self.stored = []
        self.layer = "?"

    def _request(self):
        self.requests += 1
        return f"r{self.requests}"

    def store(self, tokens, cache):
        extracted = [{"state": cache.state, "meta_state": cache.meta_state, "class_name": type(cache).__name__,
                      "class_ref": type(cache)}]
        self.s.store_cache(self._request(), list(tokens), extracted)
        self.layer = type(cache).__name__
        self.stored.append(list(tokens))

    def fetch(self, tokens):
        table, remaining = self.s.fetch_cache(self._request(), list(tokens))
        if not table or table.num_tokens == 0:
            return None, 0, "miss"
        rebuilt = self.s.reconstruct_cache(table)
        if not rebuilt:
            return None, 0, f"miss (reconstruct_cache failed on a {self.layer})"
        return copy.deepcopy(rebuilt[0]), len(tokens) - len(remaining), f"{len(table.block_ids)}-block reconstruct_cache"

    def keys(self):
        return self.stored

    def own_rule(self, tokens):
        """What its design promises: the request's leading full blocks that equal the
        leading full blocks of a stored sequence (a trailing partial block is not shared)."""
        best = 0
        for e in self.stored:
            lcp = next((i for i, (a, b) in enumerate(zip(e, tokens)) if a != b), min(len(e), len(tokens)))
            best = max(best, min(lcp, len(e) // self.block_size * self.block_size) // self.block_size * self.block_size)
        return best
