// Cache-level harness cases: being written (issue 4). A cache op drives a cache type over
// the backend under test and over the reference, and compares the observables.
