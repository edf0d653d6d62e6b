// The one cache command language and how a script runs over a cache: the harness's cache
// op (harness/ops/cache_info.cc) runs it, the properties print their cases in it, and
// `kvlab repro` replays them. A problem line carries the script as one word, e.g.
// `script=p37.d2.t3.a.d`.
//
// Grammar: commands joined by '.'; N, R, I are decimal integers without leading zeros.
//   pN       a chunk of N >= 2 tokens through attend() (prefill, chunked prefill)
//   d, dN    one, or N >= 2, single-token decode steps, each through attend()
//   uN       N >= 1 tokens stored through update() alone (update_quantized() on a
//            quantized cache): no RoPE, no attention, no output. Never merged: u2.u3
//            and u5 differ (a rotating cache writes one token in place, several by concat)
//   tN       trim the N >= 1 newest tokens if the cache is_trimmable() (mlx-lm's
//            trim_prompt_cache rule: a wrapped ring is left as it is)
//   a        a KV-shared layer (attend_shared) attends over the K/V, positions and mask
//            of the cache's last attend step
//   s        save and reload: the cache is replaced by cache_from_state(its state()), so
//            what follows checks "save → load → continue equals continue"
//   q        kind kv only, once: the cache is replaced by to_quantized() with the problem's
//            qmode/bits/group (mlx-lm's KVCache.to_quantized, what generate_step does at
//            quantized_kv_start); needs rope=0, since the stored codes are then compared
//   mN       the quantization policy with quantized_kv_start N >= 0 over the cache as one
//            layer (maybe_quantize_kv_caches, docs/lifecycle.md §Quantization policy): a
//            kind kv cache whose offset is >= N becomes its quantized form as with `q`
//            (then needs rope=0 too); any other cache is left as it is
//   e        kind rotating with keep 0 only: the cache is replaced by the snapshot a prefix
//            cache takes of it, its newest min(offset, max) tokens re-adopted by a new ring
//   c        maybe_trim_front() once more (chunked kind: docs/semantics.md §Chunked cache;
//            the script also trims before every attention and update; other kinds: none)
//   batch kinds only:
//   rN       right-padded chunk of N >= 1: prepare(right_padding) then attend(); row b of
//            B has ⌊rpad·b/(B−1)⌋ pad tokens at the end of its chunk (rpad when B = 1)
//   f        finalize() (rolls consumed right padding to the front)
//   kI_J_…   filter: keep rows I, J, … (in that order; repeats allowed by the grammar,
//            the cache decides)
//   xRpN     extend by a new cache of R >= 1 rows (left padding by the lpad rule) that
//            attended a chunk of N >= 1 tokens
//   j        every row extracted as its single cache and the rows merged back by the
//            class's merge (mlx-lm's BatchKVCache.merge: right-aligned, so the left padding
//            becomes the longest row's length less the row's own)
//   prefix scripts (kinds kv, rotating, quantized: the classes a PrefixCache stores):
//   the run keeps a prefix store (cache/prefix_cache.h) and the token log of the main
//   cache; tokens are named by id, and token I's K/V is row block I of the inputs
//   (rows I·Hkv … I·Hkv + Hkv − 1 of k and v), wherever it sits: equal ids, equal data
//   wI_J_…   store tokens I, J, … (ids >= 0) through update() alone, as one update (as
//            uN: never merged), and append them to the log
//   i        insert a deep copy of the cache into the store under the log (non-empty)
//   gI_J_…   a request for tokens I, J, …: the store's best match replaces the cache (a
//            miss: an empty cache), and the log becomes the tokens the match reused; the
//            rest of the request is for later w commands to store
//   A prefix script has only w, i, g, tN (which trims the log with the cache) and s.
// Canonical spelling: consecutive decodes merge (`d.d` is `d2`) and `p1` is `d`. A
// non-canonical spelling is rejected with the canonical one in the message, so one
// problem has exactly one line (the line is also the key of the random fill).
// A batch script must finalize (f) a right-padded chunk before it ends: the content is
// read through extract(), which refuses a pending pad (mlx-lm PR #1746).
// The chunked kind calls maybe_trim_front() before every attention and update, as llama4 does; a
// turboquant cache is seeded with the problem's seed.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "cache/attend.h"
#include "cache/cache.h"
#include "cache/catalogue.h"
#include "kvlab/backend.h"

namespace kvlab::cache_script {

enum class Verb : std::uint8_t {
  chunk, decode, update, trim, shared, reload, right_chunk, finalize, filter, extend, quantize, policy, extract, trim_front,
  write_ids, insert, get, merge
};

struct Command {
  Verb verb = Verb::decode;
  std::int64_t n = 1;               // tokens (chunk, decode count, update, right_chunk, extend), trim count, policy start
  std::int64_t rows = 0;            // extend: rows of the new cache
  std::vector<std::int32_t> keep;   // filter: the rows kept
  std::vector<std::int32_t> ids;    // write_ids, get: the token ids
  friend bool operator==(const Command&, const Command&) = default;
};
using Script = std::vector<Command>;

// Throws kvlab::Error (invalid_argument) naming the bad command, or giving the canonical
// spelling when `text` is a valid but non-canonical one.
Script parse_script(std::string_view text);
std::string script_str(const Script& script);  // the canonical word (merges decodes)

// Shrinking: every script one step simpler (a command dropped, a count halved, cut to its
// minimum or less one, a filter keeping fewer rows), canonical, most reduced first.
std::vector<std::string> simpler_scripts(std::string_view text);

// ---- running a script ----------------------------------------------------------------

using Kind = CacheKind;  // the kinds of cache/catalogue.h; `kind=` takes their names
const std::vector<std::string>& kind_names();  // in catalogue order; kv first (the simplest)
bool is_batch(Kind k);
bool is_packed(Kind k);  // K/V stored as codes

// A script runs with the catalogue's one setup (CacheSetup): its kind, the constructor's
// fields, the inputs' shape and the padding rules (the cache op leaves the rounding at
// mlx_cpu and gives a turboquant cache a whole width and the problem's seed).
AttendOptions attend_options(const CacheSetup& setup);
// The setup of a cache of `rows` rows: left_padding by the lpad rule.
CacheSetup with_rows(const CacheSetup& setup, std::int64_t rows);
std::vector<std::int32_t> left_padding_rule(const CacheSetup& setup, std::int64_t rows);
std::vector<std::int32_t> right_padding_rule(const CacheSetup& setup, std::int64_t rows);

// One attention of the script, in order: where its inputs sit in the flat (rows, D)
// input tensors and its output in the flat output. Known before anything runs.
// An update step (uN) stores K/V without attending: no queries (q_row is where the next
// attention's start), no attention() call, only Observer::stored().
enum class StepKind : std::uint8_t { main, shared, extend, update };
struct Step {
  StepKind kind = StepKind::main;
  std::int64_t batch = 0, tokens = 0;
  std::int64_t q_row = 0;   // first row of q (batch·Hq·tokens rows); also of the output
  std::int64_t kv_row = 0;  // first row of k and v (batch·Hkv·tokens rows; none for shared)
};
struct Plan {
  std::vector<Step> steps;
  std::int64_t q_rows = 0, kv_rows = 0;
  std::int64_t offset_entries = 0;  // Σ over commands of the offsets() size after it
  std::int64_t commands = 0;        // decodes counted one by one
};
// True when the script converts a kind kv cache to its quantized form (`q`, or an `mN`
// reached at offset >= N): its content is packed from then on.
bool script_quantizes(const CacheSetup& setup, const Script& script);
// A ring's newest min(offset, max_size) tokens re-adopted by a new RotatingKVCache: what
// a prefix cache keeps of it (`e`; mlx-lm#1114, vllm-mlx#256). Misuse for another class.
std::unique_ptr<Cache> extract_newest(Backend& backend, const Cache& ring);
// True when the script has a prefix command (w, i, g).
bool is_prefix_script(const Script& script);
// Throws invalid_argument for a script the kind cannot run (batch commands on a single
// cache, `a` before any attention, a filter emptying the batch, prefix commands beside
// positional ones or on a kind a prefix cache cannot store). A prefix script's inputs are
// its id table: k and v have (1 + the largest id written)·Hkv rows, q none; each `w` is
// an update step whose rows are the whole table (what it may read).
Plan plan_script(const CacheSetup& setup, const Script& script);
// The totals of plan_script() without listing its steps (a decode count in the billions
// costs nothing), saturating at 2^62: the cache op's footprint, checked before anything
// is planned or allocated. plan_script() checks that its totals agree.
struct PlanTotals {
  std::int64_t q_rows = 0, kv_rows = 0, offset_entries = 0, commands = 0;
  std::int64_t max_batch = 0;  // the most rows the batch ever has
  // Operations of the attention steps (each query row against every key so far, scores
  // and values, plus the trace's copy of the keys it saw): an upper bound that ignores
  // trims and windows. Quadratic in a script's decode count.
  std::int64_t attention_work = 0;
};
PlanTotals plan_totals(const CacheSetup& setup, const Script& script);

class Observer {
 public:
  virtual ~Observer() = default;
  // Every attention, in step order: its pre-RoPE queries (batch, Hq, tokens, D), the
  // attend result whose positions, mask and K/V it used (for a shared step: the
  // producer's), and its output.
  virtual void attention(const Step& step, const DTensor& q, const AttendResult& source, const DTensor& out) = 0;
  // After every command (each decode of dN counts): the main cache.
  virtual void after_command(const Cache& cache) = 0;
  // Every update step (uN), after the update: its K/V rows went into the cache unrotated.
  virtual void stored(const Step&) {}
};

// Inputs: q (plan.q_rows, D), k and v (plan.kv_rows, D) in setup.dtype on `backend`.
// Returns the main cache after the last command.
std::unique_ptr<Cache> run_script(Backend& backend, const CacheSetup& setup, const Script& script, const DTensor& q,
                                  const DTensor& k, const DTensor& v, Observer& observer);

// The logical content of a cache: per component (keys, values, or their packed parts),
// the real tokens of every row in (row, head, temporal) order as a (N, W) host tensor.
// Plain kinds: "keys", "values"; affine: "keys.wq", "keys.scales", "keys.biases", then
// values; fp modes without biases; turboquant: "keys.norms", "keys.indices", then values.
struct Component {
  std::string name;
  Tensor rows;
};
std::vector<Component> cache_content(const Cache& cache, const CacheSetup& setup);

}  // namespace kvlab::cache_script
