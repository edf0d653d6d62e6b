// `kvlab golden diff`: where two goldens of the same model and scenario part
// (golden/README.md "The diff"), as the JSON object the README specifies, plus the text
// summary the CLI prints. Statistics follow llama.cpp's --kl-divergence vocabulary.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "golden/golden_file.h"
#include "golden/scenario.h"

namespace kvlab::golden {

struct DiffInput {
  const Golden* golden = nullptr;
  std::string path;  // for the report only
};

// The report (README "--json schema"). Throws invalid_argument when the two are not
// comparable: different vocabularies, or a sequence whose prompts differ.
nlohmann::json diff_goldens(const DiffInput& a, const DiffInput& b, const Tolerance& tolerance);
bool diff_passed(const nlohmann::json& report);

// The tolerance a golden's own scenario line asks for (defaults when it has none).
Tolerance tolerance_of(const Golden& golden);

// A few lines for people: verdict, reasons, first divergence, summary, one line per
// sequence with its largest per-layer deltas.
std::string diff_text(const nlohmann::json& report);
// One line: "<verdict> top-1 ... max|Δlogit| ... KLD mean ... first divergence ...".
std::string diff_line(const nlohmann::json& report);

}  // namespace kvlab::golden
