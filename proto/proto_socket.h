/* proto_socket — where a user's loaderd and its clients meet by default, and the checks
 * that keep another user from squatting there. The daemon (config, server), the client
 * library, loaderctl and the Python binding (through the library) all call these, so
 * that both ends always agree on the path.
 *
 * The default socket lives in a directory only its owner can write: $XDG_RUNTIME_DIR
 * when it is usable, else a private 0700 directory /tmp/loaderd-<uid>. A socket file in
 * a directory that others can write could be created by them first. Library code: it
 * never prints, it returns codes and messages. */
#ifndef LD_PROTO_SOCKET_H
#define LD_PROTO_SOCKET_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#define LD_SOCKET_NAME "loaderd.sock"
#define LD_SOCKET_TMP_BASE "/tmp"       /* the private directory is <base>/loaderd-<uid> */

/* The default socket path into buf (size bytes):
 *  1. $LOADERD_SOCKET when set and not empty;
 *  2. $XDG_RUNTIME_DIR/loaderd.sock when XDG_RUNTIME_DIR is an absolute path to a
 *     directory (not a symlink) owned by this user with no access for group or others;
 *     a relative or unsafe one is ignored, as the XDG base directory spec asks;
 *  3. /tmp/loaderd-<uid>/loaderd.sock.
 * LD_ENAMETOOLONG when the path does not fit in buf (buf then holds ""). */
int proto_socket_default(char *buf, size_t size);

/* The private directory of the default socket for this user (/tmp/loaderd-<uid>). */
void proto_socket_private_dir(char *buf, size_t size);

/* Checks `dir` as a private socket directory: a real directory, owned by this user, no
 * access for group or others. With `create`, makes it first (mode 0700) when it is
 * missing. 0 when it is safe; otherwise LD_EACCES (or LD_ENOTDIR, or -errno) with a
 * message in errbuf (LD_ERRMSG_MAX bytes) naming the directory, its owner and mode. */
int proto_socket_check_dir(const char *dir, bool create, char *errbuf);

/* For a socket path: when it lies directly in this user's private directory (the
 * default, or LOADERD_SOCKET pointing there), checks that directory as above; any other
 * path was chosen by whoever configured it and is not checked. */
int proto_socket_check_path(const char *path, bool create, char *errbuf);

/* Before binding a Unix socket at `path`: a socket file left by a process that is gone
 * (connect refused) is removed, and 1 is returned; 0 when nothing is there. A file that
 * is not a socket is LD_EEXIST, a socket that answers LD_EADDRINUSE, a probe that fails
 * otherwise -errno; the message in errbuf (LD_ERRMSG_MAX bytes) starts with `what`. */
int proto_socket_clear_stale(const char *path, const char *what, char *errbuf);

#endif
