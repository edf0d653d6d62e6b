/* Deliberately broken plugins for the load-error tests (CMakeLists.txt):
 *   KVLAB_BAD_ABI:   exports kvlab_plugin_entry with abi_version 999
 *   otherwise:       a shared library with no kvlab_plugin_entry at all */
#include <stddef.h>

#include "kvlab/plugin.h"

#ifdef KVLAB_BAD_ABI
static const kvlab_plugin_v1 table = {999u, "bad-abi", NULL, NULL, NULL, NULL, NULL, NULL, NULL,
                                      NULL, NULL, NULL, NULL, NULL, NULL};
__attribute__((visibility("default"))) const kvlab_plugin_v1* kvlab_plugin_entry(void) { return &table; }
#else
__attribute__((visibility("default"))) int kvlab_not_a_plugin(void) { return 42; }
#endif
