/*
 * Error codes of libkvidx and kvidxd.
 *
 * Every fallible function returns 0 or a negative KVIDX_E* code. One X-macro
 * table (like libuv's UV_ERRNO_MAP) gives each code its name, the HTTP status
 * the daemon answers with, and the stable problem+json `code` of docs/http.md.
 */
#ifndef KVIDX_ERR_H
#define KVIDX_ERR_H

/* XX(name, value, http_status, problem_code, title) */
#define KVIDX_ERRNO_MAP(XX)                                                                        \
    XX(EINVAL, -1, 400, "invalid_argument", "Invalid argument")                                    \
    XX(EJSON, -2, 400, "invalid_json", "Invalid JSON")                                             \
    XX(EKEY, -3, 400, "invalid_key", "Invalid key")                                                \
    XX(ETOKEN, -4, 400, "invalid_page_token", "Invalid page token")                                \
    XX(ETOKENMISMATCH, -5, 400, "page_token_mismatch", "Page token does not match the filters")    \
    XX(ETOKENEXPIRED, -6, 410, "page_token_expired", "Page token expired")                         \
    XX(ENOTFOUND, -7, 404, "not_found", "Not found")                                               \
    XX(EHANDLEEXPIRED, -8, 410, "handle_expired", "Prefetch handle expired")                       \
    XX(ECONFLICT, -9, 409, "conflict", "Conflict")                                                 \
    XX(EMETHOD, -10, 405, "method_not_allowed", "Method not allowed")                              \
    XX(EMEDIATYPE, -11, 415, "unsupported_media_type", "Unsupported media type")                   \
    XX(EBODYSIZE, -12, 413, "payload_too_large", "Payload too large")                              \
    XX(ETOOMANYKEYS, -13, 413, "too_many_keys", "Too many keys")                                   \
    XX(EHEADERSIZE, -14, 431, "headers_too_large", "Request header fields too large")              \
    XX(EURISIZE, -15, 414, "uri_too_long", "URI too long")                                         \
    XX(ETIMEDOUT, -16, 408, "request_timeout", "Request timeout")                                  \
    XX(ECAPACITY, -17, 507, "insufficient_capacity", "Insufficient capacity")                      \
    XX(EQUOTA, -18, 507, "quota_exceeded", "Quota exceeded")                                       \
    XX(ESTORAGE, -19, 503, "storage_unavailable", "Storage unavailable")                           \
    XX(ENOTREADY, -20, 503, "not_ready", "Not ready")                                              \
    XX(EUNAUTHORIZED, -21, 401, "unauthorized", "Unauthorized")                                    \
    XX(EFORBIDDEN, -22, 403, "forbidden", "Forbidden")                                             \
    XX(EINTERNAL, -23, 500, "internal", "Internal error")                                          \
    XX(ENOMEM, -24, 503, "internal", "Out of memory")                                              \
    XX(ECONNLIMIT, -25, 503, "too_many_connections", "Too many connections")                       \
    XX(ENOBUFS, -26, 500, "internal", "Buffer too small")                                          \
    XX(EBADREQUEST, -27, 400, "invalid_argument", "Bad request")                                   \
    XX(ENOTIMPL, -28, 501, "not_implemented", "Not implemented")                                   \
    XX(EHTTPVERSION, -29, 505, "http_version_not_supported", "HTTP version not supported")         \
    XX(EUNPROCESSABLE, -30, 422, "invalid_argument", "Unprocessable content")                      \
    XX(EUNPROCESSABLEKEY, -31, 422, "invalid_key", "Unprocessable key")

typedef enum {
#define KVIDX_ERR_ENUM(name, value, status, code, title) KVIDX_##name = value,
    KVIDX_ERRNO_MAP(KVIDX_ERR_ENUM)
#undef KVIDX_ERR_ENUM
        KVIDX_ERR_MIN = -32
} kvidx_errno_t;

/* The symbolic name ("KVIDX_EKEY"), or "KVIDX_EUNKNOWN" for a code not in the table. */
const char *kvidx_err_name(int err);
/* The HTTP status for err; 500 for a code not in the table. */
int kvidx_err_status(int err);
/* The stable problem+json `code` ("invalid_key"); "internal" when unknown. */
const char *kvidx_err_code(int err);
/* A short human title ("Invalid key"). */
const char *kvidx_err_title(int err);

#endif
