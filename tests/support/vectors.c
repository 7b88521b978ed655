/* Reads golden vectors (JSON Lines) for table-driven tests. */
#include "vectors.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Every loaded file stays reachable from here, so LeakSanitizer does not
 * count vectors a test keeps until the process exits as leaks. */
static cJSON **kept[32];
static size_t nkept;

cJSON **vectors_load(const char *file, size_t *count)
{
    char path[1024];
    snprintf(path, sizeof(path), "%s/%s", KVIDX_VECTORS_DIR, file);
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, "vectors: cannot open %s\n", path);
        abort();
    }
    cJSON **items = NULL;
    size_t n = 0, cap = 0;
    char *line = NULL;
    size_t linecap = 0;
    ssize_t len;
    while ((len = getline(&line, &linecap, f)) > 0) {
        if (len == 1 && line[0] == '\n')
            continue;
        cJSON *j = cJSON_ParseWithLength(line, (size_t)len);
        if (!j) {
            fprintf(stderr, "vectors: %s line %zu does not parse\n", path, n + 1);
            abort();
        }
        if (n == cap) {
            cap = cap ? cap * 2 : 64;
            items = realloc(items, cap * sizeof(*items));
            if (!items)
                abort();
        }
        items[n++] = j;
    }
    free(line);
    fclose(f);
    if (n == 0) {
        fprintf(stderr, "vectors: %s is empty\n", path);
        abort();
    }
    if (nkept < sizeof(kept) / sizeof(kept[0]))
        kept[nkept++] = items;
    *count = n;
    return items;
}
