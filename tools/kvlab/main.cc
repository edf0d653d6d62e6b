// The kvlab command line.
#include <iostream>
#include <new>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "harness/report.h"
#include "kvlab/error.h"
#include "kvlab/suggest.h"
#include "tools/kvlab/cache_commands.h"
#include "tools/kvlab/golden_commands.h"
#include "tools/kvlab/harness_commands.h"
#include "tools/kvlab/selfcheck.h"

#ifndef KVLAB_VERSION
#define KVLAB_VERSION "unknown"
#endif

namespace {

// The first word when it names no subcommand: `kvlab help` prints the help, a typo gets
// the closest subcommand. nullopt when CLI11 should parse as usual.
std::optional<int> first_word(const CLI::App& app, int argc, char** argv) {
  if (argc < 2 || argv[1][0] == '-') return std::nullopt;
  const std::string word = argv[1];
  std::vector<std::string> names;
  for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; })) {
    if (sub->get_name() == word) return std::nullopt;
    names.push_back(sub->get_name());
  }
  if (word == "help") {
    std::cout << app.help();
    return 0;
  }
  std::string list;
  for (const std::string& n : names) list += (list.empty() ? "" : ", ") + n;
  std::cerr << "kvlab: unknown subcommand '" << word << "'" << kvlab::did_you_mean(word, names) << " (subcommands: "
            << list << "; kvlab --help)\n";
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"kvlab: a laboratory for LLM key/value caches and their kernels", "kvlab"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("kvlab ") + KVLAB_VERSION + " (" + kvlab::harness::commit_id() + ")");
  // --help shows every option's default (the value its variable holds before parsing).
  app.option_defaults()->always_capture_default();

  kvlab::tools::SelfcheckOptions self;
  CLI::App* selfcheck = app.add_subcommand("selfcheck", "Verify the reference oracle against the worked examples of docs/ and print what was verified");
  selfcheck->add_option("--seed", self.seed, "Seed of every random input (printed)");
  selfcheck->add_flag("--verbose", self.verbose, "Print the measured value of every check");

  kvlab::tools::HarnessCommands harness;
  harness.add_to(app);
  kvlab::tools::CacheCommands cache;
  cache.add_to(app);
  kvlab::tools::GoldenCommands golden;
  golden.add_to(app);

  // Exit status: 0 every selected case passed; 1 a case failed or was invalid (or the
  // backend is unavailable here, without --allow-unavailable); 2 a usage, input or
  // output error (flags included: CLI11's own codes are not used; --help is 0).
  if (const auto status = first_word(app, argc, argv)) return *status;
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return 2;
  }
  try {
    const int status = *selfcheck      ? (kvlab::tools::run_selfcheck(self, std::cout) == 0 ? 0 : 1)
                       : cache.parsed()  ? cache.run(std::cout)
                       : golden.parsed() ? golden.run(std::cout)
                                        : harness.run(std::cout);
    std::cout.flush();
    if (!std::cout) {
      std::cerr << "kvlab: cannot write to standard output\n";
      return 2;
    }
    return status;
  } catch (const kvlab::Error& e) {
    std::cout << std::flush;
    std::cerr << "kvlab: " << e.what() << "\n";
    return 2;
  } catch (const std::bad_alloc&) {
    std::cerr << "kvlab: out of memory (std::bad_alloc) outside any case\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "kvlab: " << e.what() << "\n";
    return 2;
  }
}
