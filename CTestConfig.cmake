# CDash submission for `ctest -D Experimental` (or Nightly/Continuous).
# No host is hard-coded: set the submit URL (e.g. https://cdash.example.org/submit.php?project=kvlab)
# through the cache variable KVLAB_CDASH_SUBMIT_URL or the environment variable of the
# same name, present when CMake configures (ctest -D reads the generated
# DartConfiguration.tcl). Without one, submission fails and ctest says so.
set(CTEST_PROJECT_NAME "kvlab")
set(CTEST_NIGHTLY_START_TIME "00:00:00 UTC")
if(DEFINED ENV{KVLAB_CDASH_SUBMIT_URL} AND NOT "$ENV{KVLAB_CDASH_SUBMIT_URL}" STREQUAL "")
  set(CTEST_SUBMIT_URL "$ENV{KVLAB_CDASH_SUBMIT_URL}")
elseif(DEFINED KVLAB_CDASH_SUBMIT_URL AND NOT KVLAB_CDASH_SUBMIT_URL STREQUAL "")
  set(CTEST_SUBMIT_URL "${KVLAB_CDASH_SUBMIT_URL}")
endif()
