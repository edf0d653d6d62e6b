// kvlab_bench: see bench/bench_suite.h; `kvlab_bench --help` lists the flags.
#include "bench/bench_suite.h"

int main(int argc, char** argv) { return kvlab::bench::run_suite_main(argc, argv); }
