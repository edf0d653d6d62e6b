// The bug zoo runner: for each mutant, the properties (its own family first: the batch
// properties for a batch mutant, the properties a single-cache mutant names in `first`)
// with a fixed seed (42) and kMaxSuccess cases each, until one fails. Fails if a mutant survives and
// prints the kill matrix: mutant × first property that killed it, the cases it needed
// (passing cases + 1) and the size of the shrunk counterexample (steps, tokens).
#include <gtest/gtest.h>
#include <rapidcheck.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <sstream>
#include <utility>
#include <vector>

#include "harness/check.h"
#include "harness/problem.h"
#include "property_tests/properties.h"
#include "property_tests/repro_line.h"
#include "property_tests/zoo/batch_mutants.h"
#include "property_tests/zoo/mutants.h"
#ifdef KVLAB_ZOO_WITH_VULKAN
#include "property_tests/zoo/vulkan_mutants.h"
#endif

namespace kvlab::prop::zoo {
namespace {

// A stateful killer's counterexample as a `cache` line must be one `kvlab repro` takes
// verbatim: it parses, and it runs clean on the reference (the line replays the plain
// cache, not the mutant, so a clean run is the expected outcome).
void check_repro_line(const std::string& mutant, const std::string& repro) {
  const std::string open = "kvlab repro '";
  const std::size_t at = repro.find(open);
  if (at == std::string::npos) return;  // "repro: none (...)": nothing maps, said in the text
  const std::size_t begin = at + open.size(), end = repro.find('\'', begin);
  ASSERT_NE(end, std::string::npos) << repro;
  const std::string line = repro.substr(begin, end - begin);
  EXPECT_NO_THROW(harness::parse_problem(line)) << mutant << ": " << line;
  std::ostringstream log;
  EXPECT_TRUE(harness::run_repro(line, "reference", false, {}, log)) << mutant << ": " << line << "\n" << log.str();
}

struct Row {
  std::string mutant, upstream, killer = "SURVIVED";
  int cases = 0;
  CaseSize size;
  double seconds = 0;
};

// The shrunk counterexample, indented, at most `lines` lines.
std::string excerpt(const rc::detail::FailureResult& f, int lines) {
  std::ostringstream os;
  for (const auto& [type, value] : f.counterExample) os << value << "\n";
  std::istringstream in(os.str());
  std::string line, out;
  for (int i = 0; i < lines && std::getline(in, line); ++i) out += "      " + line + "\n";
  return out;
}

// One zoo entry: the single-cache mutants (mutants.cc) run with the production batch
// hooks, the batch mutants (batch_mutants.cc) with the production single-cache hooks.
struct Entry {
  std::string id, upstream;
  Hooks hooks;
  BatchHooks batch;
  bool batch_first = false;        // a batch mechanism: try the batch properties first
  std::vector<std::string> first;  // single-cache properties to try before the others
  // Device mutants (vulkan_mutants.h): their own properties only, and why they cannot run here.
  std::vector<std::pair<std::string, std::function<void()>>> device_properties;
  std::function<std::string()> unavailable;
};

std::vector<Entry> entries() {
  std::vector<Entry> out;
  for (Mutant& m : all_mutants())
    out.push_back({m.id, m.upstream, std::move(m.hooks), production_batch_hooks(), false, std::move(m.first), {}, {}});
  for (BatchMutant& m : batch_mutants())
    out.push_back({m.id, m.upstream, production_hooks(), std::move(m.batch), true, {}, {}, {}});
#ifdef KVLAB_ZOO_WITH_VULKAN
  for (DeviceMutant& m : device_mutants())
    out.push_back({m.id, m.upstream, production_hooks(), production_batch_hooks(), false, {}, std::move(m.properties),
                   std::move(m.unavailable)});
#endif
  return out;
}

// Cases per property. Every mutant falls well within 100 cases (the kill matrix prints how
// many each needed; docs/ci.md §Test costs); each property that passes before the killer
// costs all of them, so 100 keeps a margin over the slowest kill at half the run time of
// 200 (the zoo is the longest test of the asan run). A mutant that needs more fails the
// test loudly (SURVIVED), never silently.
constexpr int kMaxSuccess = 100;

TEST(Zoo, EveryMutantIsKilled) {
  rc::detail::TestParams params;
  params.seed = 42;
  params.maxSuccess = kMaxSuccess;
  std::vector<Row> rows;
  const char* only = std::getenv("KVLAB_ZOO_ONLY");  // debugging: one mutant by id prefix
  // Every property runs against every mutant until one kills it: the single-cache
  // properties (all_properties()) and the batch ones (batch_properties()), the family of
  // the mutant's own mechanism first, so a batch mutant does not wait for eight
  // single-cache properties to pass all their cases before its own family runs.
  using Body = std::function<void(const Hooks&, const BatchHooks&)>;
  std::vector<std::pair<std::string, Body>> single, batched;
  for (const NamedProperty& p : all_properties()) {
    const auto body = p.body;
    single.emplace_back(p.name, [body](const Hooks& h, const BatchHooks&) { body(h); });
  }
  for (const NamedBatchProperty& p : batch_properties()) batched.emplace_back(p.name, p.body);
  for (const Entry& m : entries()) {
    if (only != nullptr && m.id.rfind(only, 0) != 0) continue;
    Row row;
    row.mutant = m.id;
    row.upstream = m.upstream;
    const auto t0 = std::chrono::steady_clock::now();
    if (const std::string why = m.unavailable ? m.unavailable() : ""; !why.empty()) {
      row.killer = "SKIPPED";  // not killed: it could not run
      std::cout << "[zoo] " << m.id << " skipped: " << why << "\n";
      rows.push_back(row);
      continue;
    }
    std::vector<std::pair<std::string, Body>> own = single;
    std::vector<std::pair<std::string, Body>> props;
    for (const std::string& name : m.first) {  // the named family, in the given order
      const auto it = std::find_if(own.begin(), own.end(), [&name](const auto& p) { return p.first == name; });
      if (it == own.end()) {
        ADD_FAILURE() << m.id << " names an unknown property " << name;
        continue;
      }
      props.push_back(*it);
      own.erase(it);
    }
    for (const auto& p : m.device_properties) {
      const std::function<void()> f = p.second;
      props.emplace_back(p.first, [f](const Hooks&, const BatchHooks&) { f(); });
    }
    if (m.device_properties.empty()) {
      for (const auto& p : m.batch_first ? batched : own) props.push_back(p);
      for (const auto& p : m.batch_first ? own : batched) props.push_back(p);
    }
    for (const auto& [name, body] : props) {
      last_failure_size() = {};
      last_failure_repro().clear();
      rc::detail::TestMetadata meta;
      meta.id = m.id + "/" + name;
      meta.description = meta.id;
      const Hooks& hooks = m.hooks;
      const BatchHooks& batch = m.batch;
      const auto& f = body;
      const rc::detail::TestResult result =
          rc::detail::checkTestable([&hooks, &batch, &f] { f(hooks, batch); }, meta, params);
      rc::detail::FailureResult failure;
      if (result.match(failure)) {
        row.killer = name;
        row.cases = failure.numSuccess + 1;
        row.size = last_failure_size();
        std::cout << "[zoo] " << m.id << " killed by " << name << ": " << failure.description << "\n"
                  << excerpt(failure, 14);
        if (const std::string& repro = last_failure_repro(); !repro.empty()) {
          std::cout << "      " << repro << "\n";
          check_repro_line(m.id, repro);
        }
        break;
      }
      rc::detail::Error error;
      if (result.match(error)) ADD_FAILURE() << m.id << " / " << name << ": " << error.description;
    }
    row.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_NE(row.killer, "SURVIVED") << "mutant " << m.id << " (" << m.upstream << ") survived every property";
    rows.push_back(row);
  }
  std::printf("\nKill matrix (seed 42, max_success %d)\n", kMaxSuccess);
  std::printf("%-40s %-32s %6s %6s %7s %7s  %s\n", "mutant", "first killer", "cases", "steps", "tokens", "time",
              "upstream");
  for (const Row& r : rows)
    std::printf("%-40s %-32s %6d %6lld %7lld %6.2fs  %s\n", r.mutant.c_str(), r.killer.c_str(), r.cases,
                static_cast<long long>(r.size.steps), static_cast<long long>(r.size.tokens), r.seconds,
                r.upstream.c_str());
  std::fflush(stdout);
}

}  // namespace
}  // namespace kvlab::prop::zoo
