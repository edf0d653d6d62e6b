// The kvlab command line.
#include <iostream>

#include <CLI/CLI.hpp>

#include "kvlab/error.h"
#include "tools/kvlab/harness_commands.h"
#include "tools/kvlab/selfcheck.h"

int main(int argc, char** argv) {
  CLI::App app{"kvlab: a laboratory for LLM key/value caches and their kernels"};
  app.require_subcommand(1);

  kvlab::tools::SelfcheckOptions self;
  CLI::App* selfcheck = app.add_subcommand("selfcheck", "Verify the reference oracle against the spec and print what was verified");
  selfcheck->add_option("--seed", self.seed, "Seed of every random input (printed)");
  selfcheck->add_flag("--verbose", self.verbose, "Print the measured value of every check");

  kvlab::tools::HarnessCommands harness;
  harness.add_to(app);

  CLI11_PARSE(app, argc, argv);
  try {
    if (*selfcheck) return kvlab::tools::run_selfcheck(self, std::cout) == 0 ? 0 : 1;
    return harness.run(std::cout);
  } catch (const kvlab::Error& e) {
    std::cerr << "kvlab: " << e.what() << "\n";
    return 2;
  }
}
