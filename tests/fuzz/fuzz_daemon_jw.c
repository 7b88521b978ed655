/*
 * Fuzz target for the JSON string escaper: whatever bytes go in, the output
 * must parse with cJSON, and valid UTF-8 without NUL must come back equal.
 */
#include "util/json_write.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size);

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size)
{
    struct buf b;
    struct jw w;
    buf_init(&b);
    jw_init(&w, &b);
    jw_arr_begin(&w);
    jw_strn(&w, (const char *)data, size);
    jw_arr_end(&w);
    if (b.failed)
        abort();
    cJSON *j = cJSON_ParseWithLength(b.data, b.len);
    if (!j)
        abort();
    const char *out = cJSON_GetArrayItem(j, 0)->valuestring;
    if (!strstr(b.data, "\\ufffd") && !memchr(data, 0, size)) {
        if (strlen(out) != size || memcmp(out, data, size) != 0)
            abort();
    }
    cJSON_Delete(j);
    buf_free(&b);
    return 0;
}
