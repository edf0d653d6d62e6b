// `kvlab golden diff`: where two goldens of the same model and scenario part
// (golden/README.md "The diff"), as the JSON object the README specifies, plus the text
// summary the CLI prints. Statistics follow llama.cpp's --kl-divergence vocabulary.
#pragma once

#include <filesystem>
#include <functional>
#include <string>

#include <nlohmann/json.hpp>

#include "golden/files/golden_file.h"
#include "golden/files/scenario.h"

namespace kvlab::golden {

struct DiffInput {
  const Golden* golden = nullptr;
  std::string path;  // for the report only
};

// The report (README "--json schema"). Throws invalid_argument when the two are not
// comparable: goldens of different models (model_sha256 differs: the weights are not the
// same, so no difference would mean anything), different vocabularies, or a sequence
// whose prompts differ.
nlohmann::json diff_goldens(const DiffInput& a, const DiffInput& b, const Tolerance& tolerance);
bool diff_passed(const nlohmann::json& report);

// The tolerance of a diff, and where it came from (README "Tolerance"). Never from the
// goldens themselves: a file under test could otherwise declare its own pass (its
// scenario_line is only a record), and swapping A and B could change the verdict.
struct ToleranceChoice {
  Tolerance tolerance;
  std::string from;  // for people: "from <scenario file> '<name>'", or why the defaults apply
};
// For each golden, the scenario named by its `scenario` metadata in `scenario_file_of`'s
// answer for it (a checked-in file; a path that does not exist contributes nothing);
// field by field the stricter of the two when both are found, so the order of A and B
// does not matter; the README defaults when neither is. A scenario file that exists but
// does not parse is an error.
ToleranceChoice scenario_tolerance(const Golden& a, const Golden& b,
                                   const std::function<std::filesystem::path(const Golden&)>& scenario_file_of);

// A few lines for people: verdict, reasons, first divergence, summary, one line per
// sequence with its largest per-layer deltas.
std::string diff_text(const nlohmann::json& report);
// One line: "<verdict> top-1 ... max|Δlogit| ... KLD mean ... first divergence ...".
std::string diff_line(const nlohmann::json& report);

}  // namespace kvlab::golden
