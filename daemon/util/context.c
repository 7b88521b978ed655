/*
 * Clocks for the daemon. app_now_ms() is the loop's cached monotonic time
 * (what timers compare against), or the raw monotonic clock when there is
 * no loop (unit tests); app_wall_ms() is the wall clock for values that
 * leave the process (expiry timestamps in answers).
 */
#include "util/context.h"

#include <time.h>

uint64_t app_now_ms(const struct app *app)
{
    if (app && app->loop)
        return uv_now(app->loop);
    return uv_hrtime() / 1000000u;
}

uint64_t app_wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}
