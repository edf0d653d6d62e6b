// The HTML report of a golden diff (golden/README.md, "--json schema"): `kvlab golden
// diff A B --html OUT` writes render_diff_html(<the --json object>) to OUT.
//
// One self-contained HTML5 page: inline CSS, inline SVG, no script, no external
// resource. Every string taken from the JSON is HTML-escaped (& < > " '). Non-finite
// numbers (the strings "inf", "-inf", "nan") are rendered as such; a missing optional
// field (first_divergence, summary, layer_rel absent or [], ...) renders as "—" with its
// section still present.
//
// Structure (stable ids and classes; the tests check them):
//   div#verdict.verdict.pass|.fail    banner; its first line is "PASS" or "FAIL"
//   ul#reasons > li                   one per reason (p#reasons.none "—" when none)
//   p#first-divergence                the first divergence in words ("—" when none)
//   table#metadata                    rows: field | A | B; tr.differs where A ≠ B
//   table#summary                     metric | value | tolerance; td.over when broken
//   section#sequences                 holds the sequences (p.none "—" when empty)
//   section.sequence#seq-<index>      one per sequence, <index> the JSON "index"
//     div.statuses > p.status.ok|.error   "A: ok", "B: error: ..."
//     svg.heatmap#seq-<i>-heatmap      layer_rel: exactly one rect.cell per (layer, step)
//                                      (attributes data-layer, data-step; null cells are
//                                      hatched, NaN cells black), plus
//                                      rect.first-divergent#seq-<i>-first-divergent
//                                      around the first divergent cell when it is here
//     svg.heatmap-legend               the fixed colour scale 1e-8 .. 1
//     p.none                           "—" in place of a panel with no data
//     svg.kld-plot#seq-<i>-kld         KLD per step, log y (floor 1e-12)
//     svg.dlogit-plot#seq-<i>-dlogit   max |Δlogit| per step, log y (floor 1e-12)
//     svg.top1-strip#seq-<i>-top1      one rect.top1.same|.differ per step
//     div.tokens#seq-<i>-tokens        token streams, tables of 32 steps:
//       tr.side-a / tr.side-b > td.tok  one per step; td.diverged at the first differing
//                                      step (both rows), td.after past it (dimmed),
//                                      td.missing where a side has no token
//
// Malformed input (a field of the wrong type, arrays whose lengths disagree with
// steps_compared, an index out of range) throws kvlab::Error(invalid_argument) naming
// the field, e.g. "sequences[0].kld". Bounds: at most 4096 steps and 256 layers per
// sequence, 256 sequences, 2^18 heat-map cells in all; beyond them render_diff_html
// throws instead of writing a giant page.
#pragma once

#include <cstddef>
#include <string>

#include <nlohmann/json.hpp>

namespace kvlab::golden {

inline constexpr std::size_t kHtmlMaxSteps = 4096;
inline constexpr std::size_t kHtmlMaxLayers = 256;
inline constexpr std::size_t kHtmlMaxSequences = 256;
inline constexpr std::size_t kHtmlMaxCells = std::size_t{1} << 18;

std::string render_diff_html(const nlohmann::json& diff);

}  // namespace kvlab::golden
