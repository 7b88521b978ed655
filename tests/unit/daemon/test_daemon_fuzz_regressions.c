/*
 * Inputs the daemon's fuzz targets (tests/fuzz/) found, as plain calls, so
 * that every build's tests replay them.
 */
#include "util/config.h"

#include <criterion/criterion.h>
#include <string.h>

/* An l2_source URL with an empty password ("redis://@host", "user:@host")
 * is shown with "***" for it once, and the rest of the text after it. */
Test(fuzz_regressions, l2_source_empty_password_is_shown_once)
{
    static const struct {
        const char *in, *out;
    } cases[] = {
        {"redis://@127.0.0.1:6379", "redis://***@127.0.0.1:6379"},
        {"redis://u:@h:1/0 fs:/x", "redis://u:***@h:1/0 fs:/x"},
        {"redis://u:pw@h:1 redis+cluster://@a:1,b:2",
         "redis://u:***@h:1 redis+cluster://***@a:1,b:2"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct config c;
        config_defaults(&c);
        char err[256] = "", out[4096];
        cr_assert_eq(config_set(&c, "l2_source", cases[i].in, err, sizeof(err)), 0, "%s", err);
        cr_assert_eq(config_format(&c, "l2_source", out, sizeof(out)), 0);
        cr_assert_str_eq(out, cases[i].out);
    }
}
