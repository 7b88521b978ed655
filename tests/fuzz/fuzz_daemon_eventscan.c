/*
 * Differential fuzz target for the /events scanner
 * (daemon/api/events_scan.c): on any bytes, events_scan either falls back
 * with nothing allocated, or json_parse_body accepts the same body and
 * events_decode decodes it into the very same batches, entries and token
 * ids (tests/support/eventscan_compare.h). The first input byte picks the
 * limits (default app, max_json_depth 4..7, few keys) so that the
 * fall-backs on limits are exercised too. Any disagreement aborts.
 */
#include "../support/eventscan_compare.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size);

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size)
{
    static struct app app;
    struct app *a = NULL;
    if (size > 0) {
        unsigned sel = data[0];
        data++;
        size--;
        if (sel & 1) {
            a = &app;
            app.cfg.max_json_depth = 4 + (sel >> 1) % 4;
            app.cfg.max_keys_per_request = 1 + (sel >> 3) % 8;
        }
    }
    /* An exact-size copy, so that ASan sees any read past the body. */
    char *body = malloc(size ? size : 1);
    if (!body)
        return 0;
    memcpy(body, data, size);
    if (ev_diff(body, size, a) < 0)
        abort();
    free(body);
    return 0;
}
