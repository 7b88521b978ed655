/*
 * Logging to stderr: levels and `log_format = text | json` (one JSON
 * object a line). Messages are printf-style; the json format escapes them.
 */
#ifndef KVIDXD_LOG_H
#define KVIDXD_LOG_H

#include "util/config.h"

void log_setup(enum log_level level, enum log_format format);
int log_enabled(enum log_level level);
void log_msg(enum log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define log_error(...) log_msg(LOG_ERROR, __VA_ARGS__)
#define log_warn(...)  log_msg(LOG_WARN, __VA_ARGS__)
#define log_info(...)  log_msg(LOG_INFO, __VA_ARGS__)
#define log_debug(...)                                                                             \
    do {                                                                                           \
        if (log_enabled(LOG_DEBUG))                                                                \
            log_msg(LOG_DEBUG, __VA_ARGS__);                                                       \
    } while (0)

#endif
