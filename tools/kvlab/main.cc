// The kvlab command line.
#include <iostream>
#include <new>

#include <CLI/CLI.hpp>

#include "kvlab/error.h"
#include "tools/kvlab/cache_commands.h"
#include "tools/kvlab/golden_commands.h"
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
  kvlab::tools::CacheCommands cache;
  cache.add_to(app);
  kvlab::tools::GoldenCommands golden;
  golden.add_to(app);

  // Exit status: 0 every selected case passed; 1 a case failed or was invalid (or the
  // backend is unavailable here, without --allow-unavailable); 2 a usage, input or
  // output error (flags included: CLI11's own codes are not used; --help is 0).
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
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
