/*
 * files.h - files the server keeps across restarts (the pool file, the
 * disk tier's files): opened the one careful way.
 */
#ifndef GDRKV_FILES_H
#define GDRKV_FILES_H

#include <stddef.h>
#include <sys/stat.h>

/* Opens (creating, mode 0600) the regular file at path for reading and
 * writing with extra open flags, and locks it: not through a symlink, only
 * if it is ours and nobody else may open it, and only if no other process
 * holds its lock (another gdrkv server using it). The fd, with *st filled,
 * or -1 with the reason in err, naming the file as what ("the pool file"). */
int gk_open_owned_file(const char *path, const char *what, int flags, struct stat *st,
                       char *err, size_t errlen);

#endif
