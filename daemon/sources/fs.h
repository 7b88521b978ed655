/*
 * The fs: source: an LMCache FS L2 adapter directory, scanned off the loop
 * and followed with inotify (sources/fs.c; docs/sources.md).
 */
#ifndef KVIDXD_SOURCES_FS_H
#define KVIDXD_SOURCES_FS_H

#include "state/sources.h"

struct app;

/* Creates the source named by spec ("fs:/absolute/dir", as written in
 * l2_source) with the settings of app->cfg; it is added with sources_add
 * by the caller and does nothing until started. 0, KVIDX_EINVAL (spec is
 * not fs:/... or the path is too long; the reason is logged) or
 * KVIDX_ENOMEM. */
int fs_source_create(struct app *app, const char *spec, size_t len, struct source **out);

#endif
