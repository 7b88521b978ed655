/* Test helper: reads tests/vectors/<name>.jsonl into an array of cJSON objects. */
#ifndef KVIDX_TEST_VECTORS_H
#define KVIDX_TEST_VECTORS_H

#include <cjson/cJSON.h>
#include <stddef.h>

/* Loads every line of KVIDX_VECTORS_DIR/<file>; aborts the test binary with a
 * message when the file is missing or a line does not parse. The array and
 * its items live until the process exits. */
cJSON **vectors_load(const char *file, size_t *count);

#endif
